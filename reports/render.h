// `shardfit report`: a report a person reads. Markdown or a standalone HTML
// page with: the run, the per-rank table (measured against predicted), the
// four figures users know from FSDP examples (memory before training,
// consumed = end − begin, peak consumed = peak − begin, total peak), the
// predicted breakdown at the peak, the plan's candidate table when given,
// and the memory timeline as an SVG plot: predicted and measured per rank
// on one axis, forward/backward phases shaded, the peak and the budget
// marked; the loss curve; the predicted memory by class over time.
#pragma once

#include <string>
#include <vector>

#include "reports/run_report.h"

namespace shardfit::reports {

struct RenderOptions {
  // `report --plan`: the plan's setup line, and its candidate table as cells
  // (column titles first; the chosen row marked "*"), drawn as a table.
  std::string plan_title;
  std::vector<std::vector<std::string>> plan_rows;
};

std::string render_markdown(const RunReport& report, const RenderOptions& options = {});
std::string render_html(const RunReport& report, const RenderOptions& options = {});
// The timeline plot alone (embedded in both; Markdown links it as a file).
// Its legend says when a rank's predicted line coincides with the measured
// one (they are drawn on top of each other).
std::string render_timeline_svg(const RunReport& report);
// The loss per step; "" when the report has no loss.
std::string render_loss_svg(const RunReport& report);
// The first rank's predicted memory by class (params, grads, optimizer,
// activations, ...) over the timeline, stacked; "" when the report has no
// per-class timeline.
std::string render_breakdown_svg(const RunReport& report);
// Whether two timelines are the same samples (phase, allocated, peak).
bool timelines_coincide(const std::vector<TimelinePoint>& a, const std::vector<TimelinePoint>& b);

}  // namespace shardfit::reports
