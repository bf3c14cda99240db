// `shardfit validate --plan FILE [--candidates LIST]`: the plan's promise,
// checked with the real executor (launch/validate.h), one line per
// candidate. Exit 1 on any mismatch.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/validators.h"
#include "launch/validate.h"

namespace shardfit::cli {

Command add_validate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "validate",
      "Run each candidate's predicted max batch (must fit) and max+1 (must OOM) for real");
  auto a = std::make_shared<launch::ValidateRequest>();
  sub->add_option("--plan", a->plan, "Plan JSON written by `shardfit plan --out`")
      ->required()
      ->check(Named);
  sub->add_option("--candidates", a->candidates,
                  "Comma-separated candidate ids (default: every candidate)")
      ->check(NonEmptyItems);
  sub->add_option("--out-dir", a->out_dir, "Where the per-candidate reports go")
      ->capture_default_str()
      ->check(Named);
  sub->add_option("--backend", a->backend,
                  "gloo: every rank as a process (--nproc); loopback: one process rehearses rank 0")
      ->capture_default_str();
  sub->add_option("--steps", a->steps, "Training steps per run (2 reaches the steady state)")
      ->capture_default_str()
      ->check(StepsBounds);
  sub->add_option("--max-peak-error", a->max_peak_error, "Allowed |peak error| per rank, percent")
      ->capture_default_str()
      ->check(NonNegative);
  return {sub, [a] {
            a->self_exe = self_exe();
            a->profiles_dir = profiles_dir();
            std::shared_ptr<Progress> progress;
            launch::ValidatePrinter print;
            print.begin = [&progress](size_t runs) {
              progress = std::make_shared<Progress>("validate", runs);
              std::printf("%-44s %9s %9s %10s  %s\n", "candidate", "predicted", "measured",
                          "peak err", "verdict");
            };
            print.run_starts = [&progress](const std::string& label) { progress->start(label); };
            print.row = [](const launch::ValidateRow& row) {
              char err[32] = "-";
              if (row.worst_peak_error_pct)
                std::snprintf(err, sizeof(err), "%+.3f%%", *row.worst_peak_error_pct);
              const std::string predicted = std::to_string(row.predicted);
              const std::string measured = row.measured > row.predicted   ? ">" + predicted
                                           : row.measured < row.predicted ? "<" + predicted
                                                                          : predicted;
              std::printf("%-44s %9lld %9s %10s  %s\n", row.candidate.c_str(),
                          static_cast<long long>(row.predicted), measured.c_str(), err,
                          row.ok ? "ok" : "MISMATCH");
            };
            return launch::validate(*a, print);
          }};
}

}  // namespace shardfit::cli
