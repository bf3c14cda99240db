#include "reports/render.h"

#include "reports/render_axes.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

namespace shardfit::reports {
namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.3f%%", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// FSDP examples' four figures from a timeline (bytes).
struct FourFigures {
  int64_t before = 0, consumed = 0, peak_consumed = 0, total_peak = 0;
};
FourFigures four_figures(const MemoryFigures& f) {
  FourFigures x;
  if (f.timeline.empty()) return x;
  x.before = f.timeline.front().allocated_bytes;
  x.consumed = f.timeline.back().allocated_bytes - x.before;
  x.total_peak = f.peak_allocated_bytes;
  x.peak_consumed = x.total_peak - x.before;
  return x;
}

std::string phase_kind(const std::string& phase) {
  if (phase.find("/forward") != std::string::npos) return "forward";
  if (phase.find("/backward") != std::string::npos) return "backward";
  if (phase.find("/optimizer") != std::string::npos) return "optimizer";
  return "other";
}

std::string run_summary_md(const RunReport& r) {
  std::ostringstream o;
  o << "| run | |\n|---|---|\n";
  o << "| candidate | `" << r.candidate << "` |\n";
  o << "| model | " << r.model.value("name", "?") << ", " << r.model.value("params", 0)
    << " parameters, sequence " << r.model.value("seq_len", 0) << " |\n";
  o << "| run | " << r.world_size << " rank(s), batch " << r.batch_per_gpu << " per rank, " << r.steps
    << " steps, backend " << r.backend << ", device " << r.device << " |\n";
  if (r.hardware.contains("device_mem_bytes") && r.hardware["device_mem_bytes"].is_number())
    o << "| memory budget | " << mib(r.hardware["device_mem_bytes"].get<int64_t>()) << " MiB per rank |\n";
  char tps[32];
  std::snprintf(tps, sizeof(tps), "%.0f tokens/s", r.tokens_per_s);
  o << "| throughput | " << (r.tokens_per_s > 0 ? tps : "not timed") << " |\n";
  if (!r.loss.empty()) {
    char l[64];
    std::snprintf(l, sizeof(l), "%.4f → %.4f", r.loss.front(), r.loss.back());
    o << "| loss | " << l << " |\n";
  }
  if (r.max_batch_predicted || r.max_batch_measured)
    o << "| max batch | predicted " << (r.max_batch_predicted ? std::to_string(*r.max_batch_predicted) : "-")
      << ", measured " << (r.max_batch_measured ? std::to_string(*r.max_batch_measured) : "-") << " |\n";
  if (!r.command.empty()) o << "| command | `" << r.command << "` |\n";
  if (!r.created.empty()) o << "| created | " << r.created << " |\n";
  return o.str();
}

std::string ranks_md(const RunReport& r) {
  std::ostringstream o;
  o << "| rank | measured peak MiB | predicted peak MiB | peak error | before training | consumed | "
       "peak consumed | total peak | OOM |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& k : r.ranks) {
    const auto m = four_figures(k.measured);
    o << "| " << k.rank << " | " << mib(k.measured.peak_allocated_bytes) << " | "
      << (k.predicted ? mib(k.predicted->peak_allocated_bytes) : "-") << " | "
      << (k.peak_error_pct ? pct(*k.peak_error_pct) : "-") << " | " << mib(m.before) << " | "
      << mib(m.consumed) << " | " << mib(m.peak_consumed) << " | " << mib(m.total_peak) << " | "
      << (k.oom ? "yes" : "no") << " |\n";
    if (k.predicted) {
      const auto p = four_figures(*k.predicted);
      o << "| " << k.rank << " (predicted) | | | | " << mib(p.before) << " | " << mib(p.consumed) << " | "
        << mib(p.peak_consumed) << " | " << mib(p.total_peak) << " | |\n";
    }
  }
  o << "\nFigures in MiB of allocated memory: *before training* = after init; *consumed* = end − "
       "begin; *peak consumed* = peak − begin; *total peak* = peak.\n";
  return o.str();
}

std::string breakdown_md(const RunReport& r) {
  for (const auto& k : r.ranks) {
    if (!k.predicted || k.predicted->breakdown_bytes.empty()) continue;
    std::ostringstream o;
    o << "| memory class | MiB at the predicted peak (rank " << k.rank << ") |\n|---|---|\n";
    for (const auto& [name, bytes] : k.predicted->breakdown_bytes) o << "| " << name << " | " << mib(bytes) << " |\n";
    return o.str();
  }
  return "No predicted breakdown in this report.\n";
}

// The plan's candidate table as a Markdown table (its cells hold no '|').
std::string plan_md(const RenderOptions& opt) {
  std::ostringstream o;
  o << opt.plan_title << "\n\n";
  for (size_t i = 0; i < opt.plan_rows.size(); ++i) {
    o << "|";
    for (const std::string& c : opt.plan_rows[i]) o << " " << c << " |";
    o << "\n";
    if (i == 0) {
      o << "|";
      for (size_t k = 0; k < opt.plan_rows[i].size(); ++k) o << "---|";
      o << "\n";
    }
  }
  return o.str();
}

}  // namespace

std::string render_timeline_svg(const RunReport& r) {
  const int width = 960, height = 460, left = 70, right = 90, top = 30, bottom = 120;
  const int plot_w = width - left - right, plot_h = height - top - bottom;
  // Each rank's prediction over every step the run measured (the plan's
  // step 2 is the steady state later steps repeat).
  std::vector<std::optional<MemoryFigures>> predicted;
  for (const auto& k : r.ranks)
    predicted.push_back(k.predicted ? std::optional<MemoryFigures>(extend_steady_state(
                                          *k.predicted, r.first_step == 1 ? r.steps : 0))
                                    : std::nullopt);
  size_t n = 0;
  int64_t ymax = 1;
  for (size_t ri = 0; ri < r.ranks.size(); ++ri) {
    const auto& k = r.ranks[ri];
    n = std::max(n, k.measured.timeline.size());
    for (const auto& s : k.measured.timeline) ymax = std::max({ymax, s.allocated_bytes, s.peak_allocated_bytes});
    if (predicted[ri]) {
      n = std::max(n, predicted[ri]->timeline.size());
      for (const auto& s : predicted[ri]->timeline) ymax = std::max({ymax, s.allocated_bytes, s.peak_allocated_bytes});
    }
  }
  int64_t budget = 0;
  if (r.hardware.contains("device_mem_bytes") && r.hardware["device_mem_bytes"].is_number())
    budget = r.hardware["device_mem_bytes"].get<int64_t>();
  if (budget > 0) ymax = std::max(ymax, budget);
  // The axis in MiB at round values, its top the first tick above the data.
  const Ticks ticks = nice_ticks(0, static_cast<double>(ymax) * 1.05 / (1 << 20));
  ymax = static_cast<int64_t>(ticks.hi * (1 << 20));
  auto x_of = [&](size_t i) { return left + (n <= 1 ? 0.0 : plot_w * static_cast<double>(i) / (n - 1)); };
  auto y_of = [&](int64_t b) { return top + plot_h * (1.0 - static_cast<double>(b) / ymax); };

  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
    << "' font-family='sans-serif' font-size='11'>\n";
  o << "<rect x='0' y='0' width='" << width << "' height='" << height << "' fill='white'/>\n";
  // Shade forward and backward phases, using the first rank's labels.
  const std::vector<TimelinePoint>* labels = nullptr;
  for (const auto& k : r.ranks)
    if (!k.measured.timeline.empty()) { labels = &k.measured.timeline; break; }
  if (!labels)
    for (const auto& p : predicted)
      if (p && !p->timeline.empty()) { labels = &p->timeline; break; }
  if (labels && n > 1) {
    for (size_t i = 1; i < labels->size(); ++i) {
      const std::string kind = phase_kind((*labels)[i].label);
      const char* fill = kind == "forward" ? "#e8f0ff" : kind == "backward" ? "#fff0e0" : kind == "optimizer" ? "#eaf7ea" : nullptr;
      if (!fill) continue;
      o << "<rect x='" << x_of(i - 1) << "' y='" << top << "' width='" << (x_of(i) - x_of(i - 1)) << "' height='"
        << plot_h << "' fill='" << fill << "'><title>" << escape((*labels)[i].label) << "</title></rect>\n";
    }
  }
  // Axes and grid.
  o << "<line x1='" << left << "' y1='" << top + plot_h << "' x2='" << left + plot_w << "' y2='" << top + plot_h
    << "' stroke='black'/>\n<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << top + plot_h
    << "' stroke='black'/>\n";
  for (double v : ticks.values()) {
    const auto b = static_cast<int64_t>(v * (1 << 20));
    o << "<line x1='" << left << "' y1='" << y_of(b) << "' x2='" << left + plot_w << "' y2='" << y_of(b)
      << "' stroke='#ddd'/><text x='" << left - 6 << "' y='" << y_of(b) + 4 << "' text-anchor='end'>" << format_number(v, "%g")
      << "</text>\n";
  }
  o << "<text x='14' y='" << top + plot_h / 2 << "' transform='rotate(-90 14 " << top + plot_h / 2
    << ")' text-anchor='middle'>allocated MiB (line: at phase end; dots: phase peak)</text>\n";
  if (labels)
    for (const auto& [i, text] : x_labels(*labels))
      o << "<text x='" << x_of(i) << "' y='" << top + plot_h + 12 << "' transform='rotate(35 " << x_of(i) << " "
        << top + plot_h + 12 << ")'>" << escape(text) << "</text>\n";
  if (budget > 0)
    o << "<line x1='" << left << "' y1='" << y_of(budget) << "' x2='" << left + plot_w << "' y2='" << y_of(budget)
      << "' stroke='red' stroke-dasharray='2,3'/><text x='" << left + plot_w + 4 << "' y='" << y_of(budget) + 4
      << "' fill='red'>budget</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};
  for (size_t ri = 0; ri < r.ranks.size(); ++ri) {
    const auto& k = r.ranks[ri];
    const char* color = colors[ri % 8];
    auto polyline = [&](const std::vector<TimelinePoint>& t, const char* dash) {
      if (t.empty()) return;
      // Through each phase's peak (mid-phase) to its end value: the line
      // shows how high memory went inside a phase, not just where it ended.
      o << "<polyline fill='none' stroke='" << color << "' stroke-width='1.6'" << dash << " points='";
      for (size_t i = 0; i < t.size(); ++i) {
        if (i > 0) o << (x_of(i - 1) + x_of(i)) / 2 << "," << y_of(t[i].peak_allocated_bytes) << " ";
        o << x_of(i) << "," << y_of(t[i].allocated_bytes) << " ";
      }
      o << "'/>\n";
      for (size_t i = 1; i < t.size(); ++i)
        o << "<circle cx='" << (x_of(i - 1) + x_of(i)) / 2 << "' cy='" << y_of(t[i].peak_allocated_bytes)
          << "' r='2.5' fill='" << color << "'><title>" << escape(t[i].label) << ": peak "
          << mib(t[i].peak_allocated_bytes) << " MiB</title></circle>\n";
    };
    polyline(k.measured.timeline, "");
    if (predicted[ri]) polyline(predicted[ri]->timeline, " stroke-dasharray='6,4'");
    // Mark the measured peak.
    size_t at = 0;
    for (size_t i = 0; i < k.measured.timeline.size(); ++i)
      if (k.measured.timeline[i].peak_allocated_bytes > k.measured.timeline[at].peak_allocated_bytes) at = i;
    if (!k.measured.timeline.empty() && ri == 0) {
      const double px = at > 0 ? (x_of(at - 1) + x_of(at)) / 2 : x_of(at);
      o << "<text x='" << px + 6 << "' y='" << y_of(k.measured.peak_allocated_bytes) - 6 << "' fill='" << color
        << "'>peak " << mib(k.measured.peak_allocated_bytes) << " MiB</text>\n";
    }
    // Legend: one row under the plot, two entries per rank.
    const int lx = left + static_cast<int>(ri % 2) * 420, ly = height - 14 - 14 * static_cast<int>(ri / 2);
    o << "<line x1='" << lx << "' y1='" << ly << "' x2='" << lx + 20 << "' y2='" << ly << "' stroke='" << color
      << "' stroke-width='2'/><text x='" << lx + 24 << "' y='" << ly + 4 << "'>rank " << k.rank << " measured</text>\n";
    if (k.predicted)
      o << "<line x1='" << lx + 110 << "' y1='" << ly << "' x2='" << lx + 130 << "' y2='" << ly << "' stroke='"
        << color << "' stroke-width='2' stroke-dasharray='6,4'/><text x='" << lx + 134 << "' y='" << ly + 4
        << "'>predicted"
        << (timelines_coincide(predicted[ri]->timeline, k.measured.timeline) ? " (= measured, lines coincide)" : "")
        << "</text>\n";
  }
  bool extended = false;
  for (size_t ri = 0; ri < r.ranks.size(); ++ri)
    extended = extended || (predicted[ri] && predicted[ri]->timeline.size() > r.ranks[ri].predicted->timeline.size());
  o << "<text x='" << left << "' y='18' font-size='13'>Memory timeline: " << escape(r.candidate)
    << " (blue band forward, orange backward, green optimizer"
    << (extended ? "; predicted from step 3 on: step 2's, the steady state" : "") << ")</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string render_markdown(const RunReport& r, const RenderOptions& opt) {
  std::ostringstream o;
  o << "# shardfit report: " << r.candidate << "\n\n" << run_summary_md(r) << "\n## Peak memory per rank\n\n"
    << ranks_md(r) << "\n## Predicted breakdown at the peak\n\n" << breakdown_md(r) << "\n";
  if (!opt.plan_rows.empty()) o << "## Plan\n\n" << plan_md(opt) << "\n";
  o << "## Memory timeline\n\n";
  // Markdown renderers that allow inline HTML show the SVG directly.
  o << render_timeline_svg(r) << "\n";
  return o.str();
}

std::string render_html(const RunReport& r, const RenderOptions& opt) {
  // The Markdown tables, turned into HTML tables line by line.
  auto table_html = [](const std::string& md) {
    std::istringstream in(md);
    std::ostringstream o;
    std::string line;
    bool open = false, header = true;
    while (std::getline(in, line)) {
      if (line.rfind("|", 0) != 0) {
        if (open) { o << "</table>\n"; open = false; header = true; }
        if (!line.empty()) o << "<p>" << escape(line) << "</p>\n";
        continue;
      }
      if (line.find("|---") == 0) continue;
      if (!open) { o << "<table>\n"; open = true; }
      o << "<tr>";
      std::string cell;
      std::istringstream cells(line.substr(1));
      while (std::getline(cells, cell, '|')) {
        while (!cell.empty() && cell.front() == ' ') cell.erase(0, 1);
        while (!cell.empty() && cell.back() == ' ') cell.pop_back();
        std::string c = escape(cell);
        for (size_t p; (p = c.find('`')) != std::string::npos;) {
          const size_t q = c.find('`', p + 1);
          if (q == std::string::npos) break;
          c = c.substr(0, p) + "<code>" + c.substr(p + 1, q - p - 1) + "</code>" + c.substr(q + 1);
        }
        o << (header ? "<th>" : "<td>") << c << (header ? "</th>" : "</td>");
      }
      o << "</tr>\n";
      header = false;
    }
    if (open) o << "</table>\n";
    return o.str();
  };
  std::ostringstream o;
  o << "<!doctype html>\n<html><head><meta charset='utf-8'><title>shardfit: " << escape(r.candidate)
    << "</title>\n<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
       "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
       "text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}"
       "code,pre{background:#f6f6f6}pre{padding:8px;overflow-x:auto;font-size:11px}</style></head><body>\n";
  o << "<h1>shardfit report: <code>" << escape(r.candidate) << "</code></h1>\n" << table_html(run_summary_md(r));
  o << "<h2>Memory timeline</h2>\n" << render_timeline_svg(r);
  const std::string by_class = render_breakdown_svg(r), loss = render_loss_svg(r);
  if (!by_class.empty()) o << "<h2>Predicted memory by class over time</h2>\n" << by_class;
  if (!loss.empty()) o << "<h2>Loss</h2>\n" << loss;
  o << "<h2>Peak memory per rank</h2>\n" << table_html(ranks_md(r));
  o << "<h2>Predicted breakdown at the peak</h2>\n" << table_html(breakdown_md(r));
  if (!opt.plan_rows.empty()) o << "<h2>Plan</h2>\n" << table_html(plan_md(opt));
  o << "</body></html>\n";
  return o.str();
}

}  // namespace shardfit::reports
