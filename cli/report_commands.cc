// `shardfit compare` and `shardfit report`: checks on, and renderings of,
// run reports.
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "launch/output_file.h"
#include "cli/validators.h"
#include "planner/plan_output.h"
#include "planner/plan_text.h"
#include "reports/compare.h"
#include "reports/render.h"

namespace shardfit::cli {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "compare", "Check a run report: peak error per rank, max batch, and against a baseline report");
  struct Args {
    std::string report, baseline;
    double max_peak_error = -1, max_slowdown = 50, max_error_growth = 0.5, max_step_time_error = -1;
    bool ignore_throughput = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("REPORT", a->report, "Report JSON written by `shardfit run` or `validate`")->required();
  sub->add_option("--baseline", a->baseline, "A baseline report of the same candidate")->check(Named);
  sub->add_option("--max-peak-error", a->max_peak_error,
                  "Allowed |peak error| per rank in percent (default 1 on cpu, 3 on cuda)")
      ->check(NonNegative);
  sub->add_option("--max-slowdown", a->max_slowdown,
                  "Allowed throughput loss against a baseline measured on the same machine, percent "
                  "(a baseline from another CPU, ISA or thread count is not compared)")
      ->capture_default_str()
      ->check(NonNegative);
  sub->add_flag("--ignore-throughput", a->ignore_throughput,
                "Print throughput against the baseline but never fail on it (CI gates only on memory)");
  sub->add_option("--max-step-time-error", a->max_step_time_error,
                  "Fail when the report's |step_time_error_pct| exceeds this (default: printed, not gated)")
      ->check(NonNegative);
  sub->add_option("--max-error-growth", a->max_error_growth,
                  "Allowed growth of |peak error| against the baseline, percentage points")
      ->capture_default_str()
      ->check(NonNegative);
  return {sub, [a] {
            const reports::RunReport r = reports::read_report_file(a->report);
            if (r.ranks.empty()) throw BadInput(a->report + ": \"ranks\" is empty: a report with no rank to check");
            std::optional<reports::RunReport> base;
            if (!a->baseline.empty()) base = reports::read_report_file(a->baseline);
            reports::CompareOptions o;
            if (a->max_peak_error >= 0) o.max_peak_error_pct = a->max_peak_error;
            o.max_slowdown_pct = a->max_slowdown;
            o.max_error_growth_pp = a->max_error_growth;
            o.gate_throughput = !a->ignore_throughput;
            if (a->max_step_time_error >= 0) o.max_step_time_error_pct = a->max_step_time_error;
            const auto result = reports::compare_reports(r, base ? &*base : nullptr, o);
            std::cout << r.candidate << " (" << a->report << ")\n";
            for (const auto& c : result.checks)
              std::cout << (c.passed ? "  ok    " : "  FAIL  ") << c.what << ": " << c.detail << "\n";
            if (result.checks.empty()) std::cout << "  (nothing to check)\n";
            std::cout << (result.passed() ? "pass" : "FAIL") << "\n";
            return result.passed() ? kExitOk : kExitCheckFailed;
          }};
}

Command add_report_command(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Render a run report as HTML or Markdown (tables and memory timeline)");
  struct Args {
    std::string report, out, plan;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("REPORT", a->report, "Report JSON")->required();
  sub->add_option("-o,--out", a->out, "Output file: .html or .md")->required()->check(Named);
  sub->add_option("--plan", a->plan, "Plan JSON whose candidate table to include")->check(Named);
  return {sub, [a] {
            const bool html = ends_with(a->out, ".html") || ends_with(a->out, ".htm");
            if (!html && !ends_with(a->out, ".md"))
              throw BadInput("-o " + a->out + ": the output must end in .html or .md");
            check_output_file("-o", a->out);
            const reports::RunReport r = reports::read_report_file(a->report);
            reports::RenderOptions opt;
            if (!a->plan.empty()) {
              const planner::Plan plan = planner::read_plan_file(a->plan);
              opt.plan_title = planner::plan_setup_line(plan);
              opt.plan_title.pop_back();  // its newline
              opt.plan_title += plan.chosen.empty() ? "; nothing fits batch 1" : "; chosen (*): " + plan.chosen;
              opt.plan_rows = planner::plan_table_cells(plan);
            }
            write_output_file("-o", a->out, html ? reports::render_html(r, opt) : reports::render_markdown(r, opt));
            std::cout << "wrote " << a->out << "\n";
            return kExitOk;
          }};
}

}  // namespace shardfit::cli
