// Axes for the report's SVG charts: tick values a person reads (1, 2 or 5
// times a power of ten), x labels that stay readable at any number of
// phases, and a prediction drawn over every step the run measured.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reports/run_report.h"

namespace shardfit::reports {

// `v` printed with the printf format `fmt` ("%g", "%.2f"): the charts' labels.
std::string format_number(double v, const char* fmt);

// Ticks from `lo` to at least `hi`, about `target` intervals of 1, 2 or 5
// times a power of ten: {lo', step, hi'} with lo' <= lo and hi' >= hi
// multiples of step (lo' = 0 when lo is 0).
struct Ticks {
  double lo = 0, step = 1, hi = 1;
  std::vector<double> values() const;
};
Ticks nice_ticks(double lo, double hi, int target = 5);

// Which of a timeline's points get an x label, and the label: every phase
// when there are few; otherwise the first phase of each step ("step 3"),
// thinned to at most `max_labels`, and "init". Each point's full phase name
// stays in the chart's tooltips.
std::vector<std::pair<size_t, std::string>> x_labels(const std::vector<TimelinePoint>& t, size_t max_labels = 16);

// A plan predicts init and steps 1 and 2, step 2 being the steady state that
// every later step repeats. Returns `predicted` extended to `steps` steps:
// step 2's points (and per-class bytes) again, relabelled step 3, 4, ...
// Unchanged when it has no step 2 or already covers `steps`.
MemoryFigures extend_steady_state(const MemoryFigures& predicted, int64_t steps);

}  // namespace shardfit::reports
