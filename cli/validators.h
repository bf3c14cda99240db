// CLI11 validators whose messages fit SPEC's one-line errors.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "planner/profile.h"
#include "spec/grad_buckets.h"
#include "spec/job.h"

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
        if (used == text.size() && std::isfinite(v) && v >= 0) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a finite number >= 0";
    },
    "X>=0");

inline const CLI::Validator Positive(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && std::isfinite(v) && v > 0) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a finite number > 0";
    },
    "X>0");

// A whole number in [lo, hi] (every numeric option bounded, so
// that no size overflows downstream into an internal error).
inline CLI::Validator IntRange(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(text, &used);
          if (used == text.size() && v >= lo && v <= hi) return {};
        } catch (const std::exception&) {
        }
        return "'" + text + "' must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
      },
      "N in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// A finite number of seconds from a millisecond (the least a rank can wait:
// timeouts are whole milliseconds) to a week (milliseconds fit an int64).
inline const CLI::Validator Seconds(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && std::isfinite(v) && v >= 0.001 && v <= 7 * 86400) return {};
      } catch (const std::exception&) {
      }
      return "'" + text + "' must be a number of seconds from 0.001 (a millisecond) to 604800 (a week)";
    },
    "SECONDS");

// A seed: a whole number from 0 to 2^64 - 1 (CLI11 alone clamps larger ones
// and wraps negative ones).
inline const CLI::Validator Seed(
    [](std::string& text) -> std::string {
      const std::string msg = "'" + text + "' must be a whole number from 0 to 18446744073709551615";
      if (text.empty() || text[0] < '0' || text[0] > '9') return msg;
      errno = 0;
      char* end = nullptr;
      std::strtoull(text.c_str(), &end, 10);
      if (errno == ERANGE || end == nullptr || *end != '\0') return msg;
      return {};
    },
    "SEED");

// A memory size such as 24GiB, 512MiB or bytes, above zero.
inline const CLI::Validator MemorySize(
    [](std::string& text) -> std::string {
      try {
        if (planner::parse_size_bytes(text) > 0) return {};
      } catch (const std::exception& e) {
        return "'" + text + "': " + e.what();
      }
      return "'" + text + "' must be a memory size above zero (24GiB, 512MiB, bytes)";
    },
    "SIZE");

// An option whose bounds are the job's rule (spec/job.h: --batch, --seq-len,
// --steps, --grad-accum, plan's --gpus and --nodes, run's --gpus-per-node),
// checked there once, for the command line and a plan alike, with one
// message: here only its syntax, a whole number written in decimal (CLI11
// alone would read 0x10 and 010 as 16 and 8), and the help's "N in [lo, hi]".
inline CLI::Validator JobBounds(long long lo, long long hi) {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          std::stoll(text, &used);
          if (used == text.size()) return {};
        } catch (const std::exception&) {
        }
        return "'" + text + "' must be a whole number";
      },
      "N in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
inline const CLI::Validator BatchBounds = JobBounds(1, spec::kMaxBatch);
inline const CLI::Validator SeqLenBounds = JobBounds(1, spec::kMaxSeqLen);
inline const CLI::Validator StepsBounds = JobBounds(1, spec::kMaxSteps);
inline const CLI::Validator GradAccumBounds = JobBounds(1, spec::kMaxGradAccum);
inline const CLI::Validator GpusPerNodeBounds = JobBounds(1, spec::kMaxGpusPerNode);
inline const CLI::Validator NodesBounds = JobBounds(1, spec::kMaxNodes);
inline const CLI::Validator PrefetchBounds = JobBounds(1, spec::kMaxPrefetch);

// A file, directory or name option given an empty value: '' names nothing,
// and each of these options left empty was read as not given (--resume ''
// trained from scratch, --out '' wrote no report, --candidate '' ran the
// chosen one) without a word. No description: the value's type says enough.
inline const CLI::Validator Named(
    [](std::string& text) -> std::string {
      return text.find_first_not_of(" \t") == std::string::npos
                 ? "'" + text + "' names nothing: give a value, or leave the option out"
                 : std::string();
    },
    "");

// The comma-separated items of a list option, as written (not trimmed).
inline std::vector<std::string> items_of(const std::string& text) {
  std::vector<std::string> out;
  for (size_t begin = 0;;) {
    const size_t comma = text.find(',', begin);
    out.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

// A comma-separated list option (--strategies, --precision): each item
// named, none empty ('', ',,' and 'fp32,,bf16' name nothing where an item
// stands, and would otherwise be read as the default).
inline const CLI::Validator NonEmptyItems(
    [](std::string& text) -> std::string {
      for (const std::string& item : items_of(text))
        if (item.find_first_not_of(" \t") == std::string::npos)
          return "'" + text + "' has an empty item: name each one, separated by commas";
      return {};
    },
    "LIST");

// A sweep's axis (plan's --seq-len, --gpus, --nodes, --gpu-mem): one value
// or a comma-separated list, each item checked by `item` and named in the
// message when it fails.
inline CLI::Validator ListOf(const CLI::Validator& item) {
  return CLI::Validator(
      [item](std::string& text) -> std::string {
        std::string empty = text;
        if (const std::string e = NonEmptyItems(empty); !e.empty()) return e;
        for (std::string value : items_of(text))
          if (std::string e = item(value); !e.empty()) return e;
        return {};
      },
      "LIST");
}

// At most this many plans in one sweep (a 16 x 16 grid), each a full plan.
constexpr size_t kMaxSweepPoints = 256;

// The values of a list ListOf(an integer validator) accepted.
inline std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : items_of(text)) out.push_back(std::stoll(item));
  return out;
}

}  // namespace shardfit::cli
