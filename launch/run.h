// The run layer: runs one job (a RunRequest, as `shardfit run` describes
// it) on real ranks and measures it beside the planner's prediction.
//
// Who runs what:
//  - `nproc` N: this process is the launcher (executor::launch_local): it
//    starts N copies of itself as ranks and returns their verdict (3 naming
//    the rank when one dies). Rank 0 gathers every rank's figures over the
//    communicator and writes the one report.
//  - RANK/WORLD_SIZE/... in the environment (our launcher, torchrun,
//    Slurm's variables read as torchrun's): one rank of a gloo/nccl job.
//  - backend loopback: one process rehearses rank `rank` of a world of
//    `world_size`: the same buffers, collectives done locally.
//  - otherwise one rank alone: the engine on a world of one, or with
//    reference_trainer the plain single-rank trainer (no flat params, no
//    hooks, per-parameter AdamW): the independent reference the parity
//    tests compare every strategy against.
//
// Every check that needs no rank is made before any rank starts, each one
// line naming the option (spec::BadInput); a failed rank or collective is
// spec::EnvironmentFailure, a stop signal spec::Interrupted.
#pragma once

#include <functional>
#include <string>

#include "executor/trainer.h"
#include "launch/run_job.h"
#include "reports/run_report.h"

namespace shardfit::launch {

// What a run shows as it goes and when it ends, supplied by the caller
// (the CLI prints: results on stdout, progress in the log).
struct RunPrinter {
  std::function<void(const executor::StepLog&)> step;                // each step, as it ends
  std::function<void(const reports::RunReport&, const Job&)> report;  // rank 0: the measured report
  std::function<void(const std::string&)> line;                      // rank 0: a result line (--export's files)
};

// Runs the job and returns the exit code (spec/exit_codes.h): 0, 1 (the
// loss diverged), 4 (a rank went out of memory, without oom_ok), the
// launcher's ranks' verdict, or 128 + signal from a rank that saved on a
// stop signal.
int run(const RunRequest& request, const RunPrinter& print);

}  // namespace shardfit::launch
