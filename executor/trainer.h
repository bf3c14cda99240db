// Single-rank training on the CPU: the model, AdamW, N steps over synthetic
// or token-file data, with the meter recording what every phase used. The
// multi-rank sharded engine builds on the same pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/adamw.h"
#include "executor/meter.h"
#include "models/model_config.h"
#include "spec/job.h"

namespace shardfit::executor {

// The job (spec::JobOptions: seq_len, steps, grad_accum, the schedule's
// options), then what training needs beside it. The single-rank trainer
// runs one micro-batch a step and has no collectives to schedule: it
// refuses grad_accum above 1, and the schedule is the engine's.
struct TrainOptions : spec::JobOptions {
  models::ModelConfig model;
  int64_t batch = 1;       // sequences per step (per rank, per micro-batch)
  uint64_t seed = 1234;    // model init, dropout and synthetic data
  std::string data = "synthetic";  // or an llm.c token file
  AdamWOptions adamw;
  int64_t budget_bytes = 0;  // 0 = unlimited; past it the step fails as OOM
};

struct StepLog {
  int64_t step = 0, steps = 0;
  double loss = 0, tokens_per_s = 0, elapsed_s = 0;
};

struct TrainResult {
  std::vector<double> loss;  // one per completed step
  double tokens_per_s = 0;   // after the first (warm-up) step when there are ≥ 2
  int64_t peak_allocated_bytes = 0;
  std::vector<TimelinePoint> timeline;  // init, step{n}/forward|backward|optimizer
  int64_t param_count = 0;
  bool oom = false;          // the budget was hit; `loss` holds the steps before it
  std::string oom_message;
};

// Throws std::invalid_argument for bad options (batch 0, a job
// spec::check_job_options refuses, grad_accum above 1, a sequence longer
// than the model's positions, an unreadable data file).
TrainResult train_single_rank(const TrainOptions& options,
                              const std::function<void(const StepLog&)>& on_step = {});

}  // namespace shardfit::executor
