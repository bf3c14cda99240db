// Run report reader (reports::report_from_json) and compare on what it
// accepts: std::invalid_argument or a result.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "reports/compare.h"
#include "reports/run_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: the CLI reports a parse error
  try {
    const auto r = shardfit::reports::report_from_json(j, "fuzz");
    (void)shardfit::reports::compare_reports(r, &r, {});
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
