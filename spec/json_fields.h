// The one JSON field reader: reads one JSON object's fields, naming the full
// field path and the file in every error, so a hand-edited plan, report or
// trace file says exactly what to fix (std::invalid_argument: the CLI's
// exit code 2). Used by the plan reader (planner/plan_output.cc) and the
// trace file reader (planner/trace_file.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace shardfit::spec {

class FieldReader {
 public:
  FieldReader(const nlohmann::json& node, std::string path, const std::string& origin)
      : node_(node), path_(std::move(path)), origin_(origin) {
    if (!node_.is_object()) fail_at(path_.empty() ? "(top level)" : path_, "must be an object");
  }

  [[noreturn]] void fail_at(const std::string& field, const std::string& what) const {
    throw std::invalid_argument(origin_ + ": field '" + field + "' " + what);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    fail_at(field(key), what);
  }
  std::string field(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  bool has(const std::string& key) const { return node_.contains(key); }

  const nlohmann::json& need(const std::string& key) const {
    auto it = node_.find(key);
    if (it == node_.end()) fail(key, "is missing");
    return *it;
  }

  FieldReader object(const std::string& key) const {
    return FieldReader(need(key), field(key), origin_);
  }

  std::string text(const std::string& key) const {
    const nlohmann::json& v = need(key);
    if (!v.is_string()) fail(key, "must be a string");
    return v.get<std::string>();
  }

  bool boolean(const std::string& key) const {
    const nlohmann::json& v = need(key);
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }

  int64_t integer(const std::string& key, int64_t min_value) const {
    const nlohmann::json& v = need(key);
    if (!v.is_number_integer()) fail(key, "must be a whole number");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})
      fail(key, "is too large");
    int64_t value = v.get<int64_t>();
    if (value < min_value) fail(key, "must be >= " + std::to_string(min_value));
    return value;
  }
  int64_t optional_integer(const std::string& key, int64_t min_value) const {
    return has(key) ? integer(key, min_value) : 0;
  }

  double number(const std::string& key) const {
    const nlohmann::json& v = need(key);
    if (!v.is_number()) fail(key, "must be a number");
    double value = v.get<double>();
    if (!(value >= 0)) fail(key, "must be >= 0");
    return value;
  }
  double optional_number(const std::string& key) const { return has(key) ? number(key) : 0.0; }

  const nlohmann::json& node() const { return node_; }
  const std::string& origin() const { return origin_; }

 private:
  const nlohmann::json& node_;
  std::string path_;
  std::string origin_;
};

}  // namespace shardfit::spec
