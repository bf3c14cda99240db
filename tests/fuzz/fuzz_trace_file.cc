// Trace file reader (planner::parse_trace_file, `plan --trace`):
// std::invalid_argument or a trace file whose events replay.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "planner/trace_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = shardfit::planner::parse_trace_file(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)f.param_count();
    (void)f.recompute_sets();
    (void)shardfit::planner::trace_file_json(f);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
