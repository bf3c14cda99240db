// `shardfit validate --plan FILE [--candidates LIST]`'s work: the plan's
// promise, checked with the real executor. For each candidate, train its
// predicted max batch under the plan's memory budget (must fit) and max+1
// (must go out of memory), each a `shardfit run` child process, record the
// measured max batch and the peak error per rank, and write each
// candidate's report with both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace shardfit::launch {

struct ValidateRequest {
  std::string plan;                      // plan JSON (`shardfit plan --out`)
  std::string candidates;                // comma-separated ids; "" = every candidate
  std::string out_dir = "validate-out";  // per-candidate reports, and each run's log
  std::string backend = "gloo";          // gloo: a process per rank; loopback: one rehearses rank 0
  int64_t steps = 2;                     // training steps per run (2 reaches the steady state)
  double max_peak_error = 1.0;           // allowed |peak error| per rank, percent
  std::string self_exe;                  // the shardfit binary the runs are
  std::string profiles_dir;              // where the plan's device profile is found
};

// One candidate's verdict: fits at the predicted max batch, out of memory
// at max+1, every rank's peak within max_peak_error.
struct ValidateRow {
  std::string candidate;
  int64_t predicted = 0;  // the plan's max batch
  int64_t measured = 0;   // max-1, max or max+1: bounds, not a search
  std::optional<double>
      worst_peak_error_pct;  // the largest |error| of any rank; none without a max run
  bool ok = false;
};

// What the caller shows (all optional): the number of runs ahead, each run
// as it starts ("ID batch N"), each candidate's row.
struct ValidatePrinter {
  std::function<void(size_t runs)> begin;
  std::function<void(const std::string& label)> run_starts;
  std::function<void(const ValidateRow& row)> row;
};

// Returns spec::kExitOk when every candidate is ok, else kExitCheckFailed.
// Throws spec::BadInput (a plan this build cannot validate, an unusable
// --out-dir), spec::EnvironmentFailure (a run that failed) or
// spec::Interrupted (a signal stopped the run in progress; the finished
// candidates' reports are kept).
int validate(const ValidateRequest& request, const ValidatePrinter& print);

}  // namespace shardfit::launch
