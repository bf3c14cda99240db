// Plan reader (planner::parse_plan): std::invalid_argument or a plan.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "planner/plan_output.h"
#include "planner/plan_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto plan = shardfit::planner::parse_plan(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)shardfit::planner::format_plan_table(plan);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
