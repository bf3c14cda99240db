// Plan reader (planner::parse_plan): std::invalid_argument or a plan, and
// the texts plan prints from it.
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
    // Every text a plan read back can print: --all's table, the summary and
    // its why paragraph, a sweep's grid.
    (void)shardfit::planner::format_plan_table(plan);
    (void)shardfit::planner::format_plan_summary(plan);
    (void)shardfit::planner::format_sweep_grid({plan, plan});
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
