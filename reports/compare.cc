#include "reports/compare.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardfit::reports {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a, b, c);
  return buf;
}

}  // namespace

RunReport read_report_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot read file");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(path + ": malformed JSON at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    throw std::invalid_argument(path + ": malformed JSON: " + e.what());
  }
  return report_from_json(j, path);
}

CompareResult compare_reports(const RunReport& r, const RunReport* base, const CompareOptions& o) {
  CompareResult out;
  const double tol = o.max_peak_error_pct.value_or(r.device == "cuda" ? 3.0 : 1.0);
  for (const auto& rank : r.ranks) {
    CompareCheck c;
    c.what = "rank " + std::to_string(rank.rank) + " peak error";
    if (!rank.peak_error_pct) {
      c.passed = false;
      c.detail = "no prediction in the report (run it with a plan or a candidate the planner knows)";
    } else {
      c.passed = std::fabs(*rank.peak_error_pct) <= tol;
      const double pred = rank.predicted ? static_cast<double>(r.device == "cuda" ? rank.predicted->peak_reserved_bytes
                                                                                   : rank.predicted->peak_allocated_bytes)
                                         : 0;
      const double meas = static_cast<double>(r.device == "cuda" ? rank.measured.peak_reserved_bytes
                                                                 : rank.measured.peak_allocated_bytes);
      c.detail = fmt("%+.3f%% (predicted %.0f B, measured %.0f B", *rank.peak_error_pct, pred, meas) +
                 fmt(", tolerance %.2f%%)", tol);
    }
    out.checks.push_back(c);
  }
  if (r.max_batch_predicted && r.max_batch_measured) {
    CompareCheck c;
    c.what = "max batch";
    c.passed = *r.max_batch_predicted == *r.max_batch_measured;
    c.detail = "predicted " + std::to_string(*r.max_batch_predicted) + ", measured " +
               std::to_string(*r.max_batch_measured);
    out.checks.push_back(c);
  }
  if (r.step_time_error_pct) {
    CompareCheck c;
    c.what = "step time";
    c.detail = fmt("%+.1f%% (predicted %.4f s, measured %.4f s", *r.step_time_error_pct,
                   r.step_time_predicted_s.value_or(0), r.step_time_measured_s.value_or(0));
    if (o.max_step_time_error_pct) {
      c.passed = std::fabs(*r.step_time_error_pct) <= *o.max_step_time_error_pct;
      c.detail += fmt(", tolerance %.1f%%)", *o.max_step_time_error_pct);
    } else {
      c.detail += "): not gated";
    }
    out.checks.push_back(c);
  }
  if (base) {
    if (base->candidate != r.candidate) {
      out.checks.push_back({"baseline candidate", false,
                            "baseline is " + base->candidate + ", report is " + r.candidate});
      return out;
    }
    for (const auto& rank : r.ranks) {
      for (const auto& b : base->ranks) {
        if (b.rank != rank.rank || !b.peak_error_pct || !rank.peak_error_pct) continue;
        CompareCheck c;
        c.what = "rank " + std::to_string(rank.rank) + " error vs baseline";
        const double growth = std::fabs(*rank.peak_error_pct) - std::fabs(*b.peak_error_pct);
        c.passed = growth <= o.max_error_growth_pp;
        c.detail = fmt("|error| %.3f%% vs baseline %.3f%% (allowed growth %.2f pp)",
                       std::fabs(*rank.peak_error_pct), std::fabs(*b.peak_error_pct), o.max_error_growth_pp);
        out.checks.push_back(c);
      }
    }
    if (base->tokens_per_s > 0) {
      CompareCheck c;
      c.what = "throughput vs baseline";
      const double change = 100.0 * (r.tokens_per_s - base->tokens_per_s) / base->tokens_per_s;
      c.detail = fmt("%.0f tokens/s vs %.0f (%+.1f%%", r.tokens_per_s, base->tokens_per_s, change);
      if (const auto why = speed_not_comparable(r.machine, base->machine)) {
        c.detail += "): not compared, " + *why;
      } else if (!o.gate_throughput) {
        c.detail += "): not gated";
      } else {
        c.passed = change >= -o.max_slowdown_pct;
        c.detail += fmt(", allowed -%.0f%%)", o.max_slowdown_pct);
      }
      out.checks.push_back(c);
    }
  }
  return out;
}

}  // namespace shardfit::reports
