#include "reports/render_axes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace shardfit::reports {
namespace {

// "step12/backward/root" -> 12; 0 for "init" and anything else.
int64_t step_of(const std::string& label) {
  if (label.rfind("step", 0) != 0) return 0;
  int64_t step = 0;
  size_t i = 4;
  for (; i < label.size() && label[i] >= '0' && label[i] <= '9'; ++i) step = step * 10 + (label[i] - '0');
  return i > 4 && (i == label.size() || label[i] == '/') ? step : 0;
}

}  // namespace

std::string format_number(double v, const char* fmt) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::vector<double> Ticks::values() const {
  std::vector<double> v;
  const int n = static_cast<int>(std::lround((hi - lo) / step));
  for (int i = 0; i <= n; ++i) v.push_back(lo + step * i);
  return v;
}

Ticks nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  Ticks t;
  t.step = step;
  t.lo = std::floor(lo / step) * step;
  t.hi = std::ceil(hi / step) * step;
  if (t.hi <= t.lo) t.hi = t.lo + step;
  return t;
}

std::vector<std::pair<size_t, std::string>> x_labels(const std::vector<TimelinePoint>& t, size_t max_labels) {
  std::vector<std::pair<size_t, std::string>> out;
  if (t.size() <= 12) {
    for (size_t i = 0; i < t.size(); ++i) out.emplace_back(i, t[i].label);
    return out;
  }
  // The first point of each step, then every k-th of them.
  std::vector<std::pair<size_t, int64_t>> starts;
  int64_t last = -1;
  for (size_t i = 0; i < t.size(); ++i) {
    const int64_t s = step_of(t[i].label);
    if (s != last) starts.emplace_back(i, s);
    last = s;
  }
  const size_t every = std::max<size_t>(1, (starts.size() + max_labels - 1) / std::max<size_t>(1, max_labels));
  for (size_t k = 0; k < starts.size(); k += every) {
    const auto [i, s] = starts[k];
    out.emplace_back(i, s > 0 ? "step " + std::to_string(s) : t[i].label);
  }
  return out;
}

MemoryFigures extend_steady_state(const MemoryFigures& predicted, int64_t steps) {
  int64_t covered = 0;
  std::vector<size_t> step2;
  for (size_t i = 0; i < predicted.timeline.size(); ++i) {
    const int64_t s = step_of(predicted.timeline[i].label);
    covered = std::max(covered, s);
    if (s == 2) step2.push_back(i);
  }
  if (step2.empty() || covered != 2 || steps <= 2) return predicted;
  const bool classes = predicted.timeline_category_bytes.size() == predicted.timeline.size();
  MemoryFigures out = predicted;
  for (int64_t s = 3; s <= steps; ++s)
    for (size_t i : step2) {
      TimelinePoint p = predicted.timeline[i];
      p.label = "step" + std::to_string(s) + p.label.substr(p.label.find('/'));
      out.timeline.push_back(p);
      if (classes) out.timeline_category_bytes.push_back(predicted.timeline_category_bytes[i]);
    }
  return out;
}

}  // namespace shardfit::reports
