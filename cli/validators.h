// CLI11 validators whose messages fit SPEC's one-line errors.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace shardfit::cli {

inline const CLI::Validator AtLeastOne(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        const long long v = std::stoll(text, &used);
        if (used == text.size() && v >= 1) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a whole number of at least 1";
    },
    "N>=1");

inline const CLI::Validator NonNegative(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && v >= 0) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a number >= 0";
    },
    "X>=0");

inline const CLI::Validator Positive(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && v > 0) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a number > 0";
    },
    "X>0");

}  // namespace shardfit::cli
