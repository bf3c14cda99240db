// Small text helpers shared by the communicator backends (comm.cc,
// nccl_comm.cc) for their one-line errors. Internal: not part of comm.h.
#pragma once

#include <chrono>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace shardfit::executor::comm_detail {

inline std::string join_ints(const std::vector<int>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

inline std::string seconds_str(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << t.count() / 1000.0 << " s";
  return s.str();
}

// The first line of a library error, without c10's backtrace.
inline std::string error_text(const std::exception& e) {
  std::string what = dynamic_cast<const c10::Error*>(&e)
                         ? static_cast<const c10::Error&>(e).what_without_backtrace()
                         : e.what();
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

}  // namespace shardfit::executor::comm_detail
