#include "launch/validate.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "executor/signals.h"
#include "launch/child_process.h"
#include "launch/output_file.h"
#include "planner/candidate.h"
#include "planner/plan_output.h"
#include "planner/profile.h"
#include "reports/compare.h"
#include "reports/run_report.h"
#include "spec/errors.h"
#include "spec/exit_codes.h"
#include "spec/job.h"

namespace shardfit::launch {
using spec::BadInput;
using spec::EnvironmentFailure;
using spec::Interrupted;

int validate(const ValidateRequest& req, const ValidatePrinter& print) {
  try {
    spec::check_steps(req.steps);  // the rule run applies to the --steps it is given
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  executor::install_stop_signal_handlers();
  const planner::Plan plan = planner::read_plan_file(req.plan);
  if (req.backend != "gloo" && req.backend != "loopback")
    throw BadInput("--backend " + req.backend + ": expected gloo or loopback");
  // validate trains CPU ranks: a CUDA card's plan would train the
  // card's max batch on the CPU against the card's allocator model.
  if (plan.hardware.profile != "cpu" &&
      planner::load_profile(plan.hardware.profile, req.profiles_dir).kind !=
          planner::DeviceKind::kCpu)
    throw BadInput(
        req.plan + ": planned for " + plan.hardware.profile +
        " (CUDA); this build validates on the CPU only: plan with --device cpu, or check a "
        "card with scripts/gpu-check");
  if (plan.hardware.device_mem_bytes <= 0)
    throw BadInput(req.plan + ": the plan has no memory budget (plan it with --gpu-mem)");
  std::vector<const planner::PlanCandidate*> todo;
  if (req.candidates.empty()) {
    for (const auto& c : plan.candidates) todo.push_back(&c);
  } else {
    for (const auto& id : planner::split_list(req.candidates)) {
      todo.push_back(&planner::candidate_to_use(plan, req.plan, "--candidates", id));
    }
  }
  {
    std::error_code ec;
    std::filesystem::create_directories(req.out_dir, ec);
    if (ec || !std::filesystem::is_directory(req.out_dir, ec))
      throw BadInput("--out-dir " + req.out_dir + ": not a directory that can be created" +
                     (ec ? " (" + ec.message() + ")" : std::string(" (a file is in the way)")));
    if (::access(req.out_dir.c_str(), W_OK | X_OK) != 0)
      throw BadInput("--out-dir " + req.out_dir + ": the directory is not writable");
  }
  const int world = plan.hardware.world_size();
  bool all_ok = true;
  if (print.begin) print.begin(todo.size() * 2);  // max and max+1 per candidate
  for (const auto* c : todo) {
    std::string safe = c->id();
    for (auto& ch : safe)
      if (ch == '/' || ch == ':' || ch == '+' || ch == '=') ch = '_';
    auto run_at = [&](int64_t batch, const std::string& out) {
      if (print.run_starts) print.run_starts(c->id() + " batch " + std::to_string(batch));
      std::vector<std::string> argv = {
          req.self_exe,  "run",
          "--plan",      req.plan,
          "--candidate", c->id(),
          "--batch",     std::to_string(batch),
          "--steps",     std::to_string(req.steps),
          "--gpu-mem",   std::to_string(plan.hardware.device_mem_bytes),
          "--out",       out,
          "--oom-ok"};  // max+1 must OOM: a result
      if (req.backend == "gloo") {
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
      if (rc != 0)
        throw EnvironmentFailure(c->id() + " batch " + std::to_string(batch) + ": run exited " +
                                 std::to_string(rc) + " (log: " + out + ".log)");
      return reports::read_report_file(out);
    };
    const int64_t max_b = c->max_batch_per_gpu;
    std::optional<reports::RunReport> at_max;
    bool fits = true;
    if (max_b > 0) {
      at_max = run_at(max_b, req.out_dir + "/" + safe + ".max.json");
      for (const auto& r : at_max->ranks) fits = fits && !r.oom;
    }
    const auto next = run_at(max_b + 1, req.out_dir + "/" + safe + ".next.json");
    bool next_fits = true;
    for (const auto& r : next.ranks) next_fits = next_fits && !r.oom;
    const int64_t measured =
        !fits ? max_b - 1 : (next_fits ? max_b + 1 : max_b);  // bounds, not a search
    double worst = 0;
    if (at_max)
      for (const auto& r : at_max->ranks)
        if (r.peak_error_pct && std::fabs(*r.peak_error_pct) > std::fabs(worst))
          worst = *r.peak_error_pct;
    const bool ok = fits && !next_fits && std::fabs(worst) <= req.max_peak_error;
    all_ok = all_ok && ok;
    if (at_max) {
      reports::RunReport r = *at_max;
      r.max_batch_predicted = max_b;
      r.max_batch_measured = measured;
      write_output_file("--out-dir", req.out_dir + "/" + safe + ".json",
                        reports::to_json(r).dump(2) + "\n");
    }
    if (print.row)
      print.row(
          {c->id(), max_b, measured, at_max ? std::optional<double>(worst) : std::nullopt, ok});
  }
  return all_ok ? spec::kExitOk : spec::kExitCheckFailed;
}

}  // namespace shardfit::launch
