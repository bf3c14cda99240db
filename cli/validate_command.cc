// `shardfit validate --plan FILE [--candidates LIST]`: the plan's promise,
// checked with the real executor. For each candidate, train its predicted
// max batch under the plan's memory budget (must fit) and max+1 (must go
// out of memory), record the measured max batch and the peak error per
// rank, and write each candidate's report with both. Exit 1 on any
// mismatch.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/progress.h"
#include "launch/child_process.h"
#include "launch/output_file.h"
#include "cli/validators.h"
#include "executor/signals.h"
#include "planner/candidate.h"
#include "planner/plan_output.h"
#include "planner/profile.h"
#include "reports/compare.h"
#include "reports/run_report.h"
#include "spec/job_limits.h"

namespace shardfit::cli {
namespace {

struct Args {
  std::string plan;
  std::string candidates;
  std::string out_dir = "validate-out";
  std::string backend = "gloo";
  int64_t steps = 2;
  double max_peak_error = 1.0;
};

}  // namespace

Command add_validate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "validate", "Run each candidate's predicted max batch (must fit) and max+1 (must OOM) for real");
  auto a = std::make_shared<Args>();
  sub->add_option("--plan", a->plan, "Plan JSON written by `shardfit plan --out`")->required()->check(Named);
  sub->add_option("--candidates", a->candidates, "Comma-separated candidate ids (default: every candidate)")
      ->check(NonEmptyItems);
  sub->add_option("--out-dir", a->out_dir, "Where the per-candidate reports go")->capture_default_str()->check(Named);
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
            spec::check_steps(a->steps);  // the rule run applies to the --steps it is given
            executor::install_stop_signal_handlers();
            const planner::Plan plan = planner::read_plan_file(a->plan);
            if (a->backend != "gloo" && a->backend != "loopback")
              throw BadInput("--backend " + a->backend + ": expected gloo or loopback");
            // validate trains CPU ranks: a CUDA card's plan would train the
            // card's max batch on the CPU against the card's allocator model.
            if (plan.hardware.profile != "cpu" &&
                planner::load_profile(plan.hardware.profile, profiles_dir()).kind != planner::DeviceKind::kCpu)
              throw BadInput(a->plan + ": planned for " + plan.hardware.profile +
                             " (CUDA); this build validates on the CPU only: plan with --device cpu, or check a "
                             "card with scripts/gpu-check");
            if (plan.hardware.device_mem_bytes <= 0)
              throw BadInput(a->plan + ": the plan has no memory budget (plan it with --gpu-mem)");
            std::vector<const planner::PlanCandidate*> todo;
            if (a->candidates.empty()) {
              for (const auto& c : plan.candidates) todo.push_back(&c);
            } else {
              for (const auto& id : planner::split_list(a->candidates)) {
                todo.push_back(&planner::candidate_to_use(plan, a->plan, "--candidates", id));
              }
            }
            {
              std::error_code ec;
              std::filesystem::create_directories(a->out_dir, ec);
              if (ec || !std::filesystem::is_directory(a->out_dir, ec))
                throw BadInput("--out-dir " + a->out_dir + ": not a directory that can be created" +
                               (ec ? " (" + ec.message() + ")" : std::string(" (a file is in the way)")));
              if (::access(a->out_dir.c_str(), W_OK | X_OK) != 0)
                throw BadInput("--out-dir " + a->out_dir + ": the directory is not writable");
            }
            const int world = plan.hardware.world_size();
            bool all_ok = true;
            Progress progress("validate", todo.size() * 2);  // max and max+1 per candidate
            std::printf("%-44s %9s %9s %10s  %s\n", "candidate", "predicted", "measured", "peak err", "verdict");
            for (const auto* c : todo) {
              std::string safe = c->id();
              for (auto& ch : safe)
                if (ch == '/' || ch == ':' || ch == '+' || ch == '=') ch = '_';
              auto run_at = [&](int64_t batch, const std::string& out) {
                progress.start(c->id() + " batch " + std::to_string(batch));
                std::vector<std::string> argv = {self_exe(), "run", "--plan", a->plan, "--candidate", c->id(),
                                                 "--batch", std::to_string(batch), "--steps", std::to_string(a->steps),
                                                 "--gpu-mem", std::to_string(plan.hardware.device_mem_bytes),
                                                 "--out", out, "--oom-ok"};  // max+1 must OOM: a result
                if (a->backend == "gloo") {
                  // The plan's world, on whatever cores this machine has.
                  argv.insert(argv.end(), {"--nproc", std::to_string(world), "--oversubscribe"});
                } else {
                  argv.insert(argv.end(), {"--backend", "loopback", "--world-size", std::to_string(world)});
                }
                const launch::ChildExit child = launch::run_child(argv, out + ".log");
                if (child.stop_signal)
                  throw Interrupted("interrupted by " + executor::signal_name(child.stop_signal) +
                                        ": stopped the run in progress (" + out +
                                        ".log); reports of finished candidates are kept",
                                    child.stop_signal);
                const int rc = child.status;
                if (rc != 0) throw EnvironmentFailure(c->id() + " batch " + std::to_string(batch) + ": run exited " +
                                                      std::to_string(rc) + " (log: " + out + ".log)");
                return reports::read_report_file(out);
              };
              const int64_t max_b = c->max_batch_per_gpu;
              std::optional<reports::RunReport> at_max;
              bool fits = true;
              if (max_b > 0) {
                at_max = run_at(max_b, a->out_dir + "/" + safe + ".max.json");
                for (const auto& r : at_max->ranks) fits = fits && !r.oom;
              }
              const auto next = run_at(max_b + 1, a->out_dir + "/" + safe + ".next.json");
              bool next_fits = true;
              for (const auto& r : next.ranks) next_fits = next_fits && !r.oom;
              const int64_t measured = !fits ? max_b - 1 : (next_fits ? max_b + 1 : max_b);  // bounds, not a search
              double worst = 0;
              if (at_max)
                for (const auto& r : at_max->ranks)
                  if (r.peak_error_pct && std::fabs(*r.peak_error_pct) > std::fabs(worst)) worst = *r.peak_error_pct;
              const bool ok = fits && !next_fits && std::fabs(worst) <= a->max_peak_error;
              all_ok = all_ok && ok;
              if (at_max) {
                reports::RunReport r = *at_max;
                r.max_batch_predicted = max_b;
                r.max_batch_measured = measured;
                write_output_file("--out-dir", a->out_dir + "/" + safe + ".json", reports::to_json(r).dump(2) + "\n");
              }
              char err[32];
              std::snprintf(err, sizeof(err), "%+.3f%%", worst);
              std::printf("%-44s %9lld %9s %10s  %s\n", c->id().c_str(), static_cast<long long>(max_b),
                          (measured > max_b ? ">" + std::to_string(max_b) : measured < max_b ? "<" + std::to_string(max_b) : std::to_string(max_b)).c_str(),
                          at_max ? err : "-", ok ? "ok" : "MISMATCH");
            }
            return all_ok ? kExitOk : kExitCheckFailed;
          }};
}

}  // namespace shardfit::cli
