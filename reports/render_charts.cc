// The report's smaller charts: the loss curve and the predicted memory by
// class over time (see render.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "reports/render.h"
#include "reports/render_axes.h"

namespace shardfit::reports {
namespace {

constexpr int kWidth = 960, kLeft = 70, kRight = 150, kTop = 30;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '\'')
      o += "&#39;";
    else
      o += c;
  }
  return o;
}

// Memory classes bottom to top, each with its colour.
struct ClassStyle {
  const char* name;
  const char* color;
};
constexpr ClassStyle kClasses[] = {
    {"params", "#4e79a7"},      {"grads", "#f28e2b"},        {"optimizer", "#59a14f"},
    {"activations", "#e15759"}, {"comm_buffers", "#b07aa1"}, {"temporaries", "#9c755f"},
    {"overhead", "#bab0ac"},
};

}  // namespace

bool timelines_coincide(const std::vector<TimelinePoint>& a,
                        const std::vector<TimelinePoint>& b) {
  if (a.empty() || a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].label != b[i].label || a[i].allocated_bytes != b[i].allocated_bytes ||
        a[i].peak_allocated_bytes != b[i].peak_allocated_bytes)
      return false;
  return true;
}

std::string render_loss_svg(const RunReport& r) {
  if (r.loss.empty()) return "";
  const int height = 260, plot_h = height - kTop - 40, plot_w = kWidth - kLeft - kRight;
  double lo = r.loss.front(), hi = r.loss.front();
  for (double v : r.loss)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  // Round tick values around the data.
  const Ticks ticks = nice_ticks(lo, hi, 4);
  lo = ticks.lo;
  hi = ticks.hi;
  const size_t n = r.loss.size();
  auto x_of = [&](size_t i) {
    return kLeft + (n <= 1 ? plot_w / 2.0 : plot_w * double(i) / double(n - 1));
  };
  auto y_of = [&](double v) { return kTop + plot_h * (1.0 - (v - lo) / (hi - lo)); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' class='loss' width='" << kWidth << "' height='"
    << height
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  o << "<line x1='" << kLeft << "' y1='" << kTop + plot_h << "' x2='" << kLeft + plot_w << "' y2='"
    << kTop + plot_h << "' stroke='black'/><line x1='" << kLeft << "' y1='" << kTop << "' x2='"
    << kLeft << "' y2='" << kTop + plot_h << "' stroke='black'/>\n";
  for (double v : ticks.values())
    o << "<text x='" << kLeft - 6 << "' y='" << y_of(v) + 4 << "' text-anchor='end'>" << format_number(v, "%g")
      << "</text>\n";
  o << "<text x='" << kLeft << "' y='" << kTop + plot_h + 16 << "'>step " << r.first_step
    << "</text><text x='" << kLeft + plot_w << "' y='" << kTop + plot_h + 16
    << "' text-anchor='end'>step " << r.first_step + static_cast<int64_t>(n) - 1 << "</text>\n";
  o << "<polyline class='loss' fill='none' stroke='#1f77b4' stroke-width='1.8' points='";
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(r.loss[i])) o << x_of(i) << "," << y_of(r.loss[i]) << " ";
  o << "'/>\n";
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(r.loss[i]))
      o << "<circle cx='" << x_of(i) << "' cy='" << y_of(r.loss[i])
        << "' r='2' fill='#1f77b4'><title>step " << r.first_step + static_cast<int64_t>(i)
        << ": loss " << format_number(r.loss[i], "%.4f") << "</title></circle>\n";
  o << "<text x='" << kLeft << "' y='18' font-size='13'>Training loss per step (" << n << " step"
    << (n == 1 ? "" : "s") << ", " << format_number(r.loss.front(), "%.4f") << " -> "
    << format_number(r.loss.back(), "%.4f") << ")</text>\n</svg>\n";
  return o.str();
}

std::string render_breakdown_svg(const RunReport& r) {
  const RankReport* rank = nullptr;
  for (const auto& k : r.ranks)
    if (k.predicted && !k.predicted->timeline.empty() &&
        k.predicted->timeline_category_bytes.size() == k.predicted->timeline.size()) {
      rank = &k;
      break;
    }
  if (!rank) return "";
  // Over every step the run measured: the plan's step 2 is the steady state.
  const MemoryFigures predicted = extend_steady_state(*rank->predicted, r.first_step == 1 ? r.steps : 0);
  const auto& t = predicted.timeline;
  const auto& classes = predicted.timeline_category_bytes;
  const int height = 380, bottom = 110, plot_h = height - kTop - bottom,
            plot_w = kWidth - kLeft - kRight;
  int64_t ymax = 1;
  for (size_t i = 0; i < t.size(); ++i) {
    int64_t sum = 0;
    for (const auto& [k, v] : classes[i]) sum += v;
    ymax = std::max({ymax, sum, t[i].allocated_bytes});
  }
  const Ticks ticks = nice_ticks(0, static_cast<double>(ymax) * 1.05 / (1 << 20), 4);
  ymax = static_cast<int64_t>(ticks.hi * (1 << 20));
  const size_t n = t.size();
  auto x_of = [&](size_t i) { return kLeft + (n <= 1 ? 0.0 : plot_w * double(i) / double(n - 1)); };
  auto y_of = [&](int64_t b) { return kTop + plot_h * (1.0 - double(b) / double(ymax)); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' class='breakdown' width='" << kWidth << "' height='"
    << height
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  std::vector<int64_t> base(n, 0);
  int row = 0;
  for (const ClassStyle& c : kClasses) {
    bool any = false;
    for (const auto& at : classes) {
      auto it = at.find(c.name);
      any = any || (it != at.end() && it->second > 0);
    }
    if (!any) continue;
    std::vector<int64_t> top(n);
    for (size_t i = 0; i < n; ++i) {
      auto it = classes[i].find(c.name);
      top[i] = base[i] + (it == classes[i].end() ? 0 : it->second);
    }
    o << "<polygon class='class-" << c.name << "' fill='" << c.color
      << "' fill-opacity='0.85' points='";
    for (size_t i = 0; i < n; ++i) o << x_of(i) << "," << y_of(top[i]) << " ";
    for (size_t i = n; i-- > 0;) o << x_of(i) << "," << y_of(base[i]) << " ";
    o << "'><title>" << c.name << "</title></polygon>\n";
    o << "<rect x='" << kLeft + plot_w + 12 << "' y='" << kTop + 14 * row
      << "' width='12' height='10' fill='" << c.color << "'/><text x='" << kLeft + plot_w + 28
      << "' y='" << kTop + 14 * row + 9 << "'>" << c.name << "</text>\n";
    ++row;
    base = top;
  }
  // Each phase's name and total at the top of its stack, as a tooltip.
  for (size_t i = 0; i < n; ++i)
    o << "<circle cx='" << x_of(i) << "' cy='" << y_of(base[i]) << "' r='2' fill='#333'><title>" << esc(t[i].label)
      << ": " << format_number(double(base[i]) / (1 << 20), "%.2f") << " MiB</title></circle>\n";
  o << "<line x1='" << kLeft << "' y1='" << kTop + plot_h << "' x2='" << kLeft + plot_w << "' y2='"
    << kTop + plot_h << "' stroke='black'/><line x1='" << kLeft << "' y1='" << kTop << "' x2='"
    << kLeft << "' y2='" << kTop + plot_h << "' stroke='black'/>\n";
  for (double v : ticks.values())
    o << "<text x='" << kLeft - 6 << "' y='" << y_of(static_cast<int64_t>(v * (1 << 20))) + 4
      << "' text-anchor='end'>" << format_number(v, "%g") << "</text>\n";
  for (const auto& [i, text] : x_labels(t))
    o << "<text x='" << x_of(i) << "' y='" << kTop + plot_h + 12 << "' transform='rotate(35 "
      << x_of(i) << " " << kTop + plot_h + 12 << ")'>" << esc(text) << "</text>\n";
  o << "<text x='" << kLeft
    << "' y='18' font-size='13'>Predicted allocated MiB by class at each phase end, rank "
    << rank->rank << " (the meter measures totals only)</text>\n</svg>\n";
  return o.str();
}

}  // namespace shardfit::reports
