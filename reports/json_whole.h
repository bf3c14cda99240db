// A whole number read from JSON, checked. nlohmann's get<int64_t>() casts a
// float (2.2e24 into int64_t is undefined behaviour) and wraps an unsigned
// beyond the range; fuzz_report found both ways into the report reader.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace shardfit::reports {

// `v` as T; std::invalid_argument naming `what` unless it is an integer in
// T's range.
template <typename T>
T json_whole(const nlohmann::json& v, const std::string& what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!v.is_number_integer()) throw std::invalid_argument(what + " must be a whole number");
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                        : v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                              v.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
  if (!fits) throw std::invalid_argument(what + " is out of range");
  return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
}

}  // namespace shardfit::reports
