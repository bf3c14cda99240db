// `shardfit report`: a report a person reads. Markdown or a standalone HTML
// page with: the run, the per-rank table (measured against predicted), the
// four figures users know from FSDP examples (memory before training,
// consumed = end − begin, peak consumed = peak − begin, total peak), the
// predicted breakdown at the peak, the plan's candidate table when given,
// and the memory timeline as an SVG plot: predicted and measured per rank
// on one axis, forward/backward phases shaded, the peak and the budget
// marked.
#pragma once

#include <string>

#include "reports/run_report.h"

namespace shardfit::reports {

struct RenderOptions {
  std::string plan_table;  // preformatted `shardfit plan` table, optional
};

std::string render_markdown(const RunReport& report, const RenderOptions& options = {});
std::string render_html(const RunReport& report, const RenderOptions& options = {});
// The timeline plot alone (embedded in both; Markdown links it as a file).
std::string render_timeline_svg(const RunReport& report);

}  // namespace shardfit::reports
