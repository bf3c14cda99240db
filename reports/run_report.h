// The run report (SPEC: "schema": "shardfit.report/1"): what a run measured
// on each rank, and beside it what the planner predicted for the same
// candidate and batch. Written by `shardfit run`, read by `compare` and
// `report`. No LibTorch here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/machine.h"
#include "spec/schedule.h"
#include "spec/timeline.h"

namespace shardfit::reports {

// A timeline point, predicted or measured (spec/timeline.h); JSON: each
// point's "phase" (its label), allocated, reserved and peak allocated bytes.
using spec::TimelinePoint;

struct MemoryFigures {
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  std::vector<TimelinePoint> timeline;
  // Allocated bytes by memory class at each timeline sample (SPEC's
  // breakdown keys), parallel to `timeline`; the planner knows them, the
  // meter does not (empty = unknown). JSON: each sample's "category_bytes".
  std::vector<std::map<std::string, int64_t>> timeline_category_bytes;
  // Bytes by memory class at the peak (SPEC's breakdown keys); the planner
  // knows it, the meter does not (empty = unknown).
  std::map<std::string, int64_t> breakdown_bytes;
};

struct RankReport {
  int rank = 0;
  MemoryFigures measured;
  std::optional<MemoryFigures> predicted;  // absent until a plan is attached
  std::optional<double> peak_error_pct;    // 100 × (predicted − measured) / measured
  bool oom = false;                        // the run hit the memory budget
  std::string oom_message;
  // `run --init`: the checkpoint data bytes this rank read (its own shard's
  // elements under zero2/zero3/hybrid, every parameter under ddp/zero1).
  std::optional<int64_t> init_read_bytes;
};

struct RunReport {
  std::string candidate;  // e.g. "ddp/fp32/wrap=none"
  nlohmann::json model;     // {"name", "params", "seq_len"}
  nlohmann::json hardware;  // {"profile", "device_mem_bytes", ...}
  int64_t batch_per_gpu = 0;
  // --prefetch, --async-reduce, --async-gather; absent in older reports:
  // 1, false, false.
  spec::ScheduleOptions schedule;
  int world_size = 1;
  std::string backend;  // "gloo", "nccl", "loopback", "none" (one rank)
  std::string device;   // "cpu" or "cuda"
  int64_t steps = 0;       // steps run (loss has one entry each)
  int64_t first_step = 1;  // the step `loss` starts at: > 1 when resumed from a checkpoint
  std::vector<double> loss;
  std::vector<std::string> checkpoints;  // committed checkpoint directories (--save)
  std::string resumed_from;              // the checkpoint directory (--resume), or ""
  // `run --init`: the Hugging Face checkpoint, and its parameters' stored
  // bytes (each rank's share in ranks[].init_read_bytes); "" and 0 without.
  std::string init_from;
  int64_t init_data_bytes = 0;
  // --resume-anyway: the options that differ from the checkpoint's job
  // ("batch_per_gpu 4 -> 8"), so the loss curve is not the one it would have been.
  std::vector<std::string> resume_changes;
  int64_t diverged_at_step = 0;  // > 0: the loss went NaN/Inf there and the run stopped
  bool interrupted = false;      // SIGTERM/SIGINT stopped the run; the figures are what it had
  // --save-on-signal: > 0, the step every rank finished and saved (checkpoints.back()) before stopping
  int64_t saved_on_signal_step = 0;
  double tokens_per_s = 0;
  // ddp/zero1: the gradient buckets the engine all-reduced, bytes each, in
  // the order backward fills them (spec/grad_buckets.h); empty otherwise.
  std::vector<int64_t> ddp_bucket_bytes;
  // One training step, in seconds: measured = the job's tokens per step /
  // tokens_per_s (the timed steps: after the first when there are two or
  // more); predicted = the planner's time model on the report's profile.
  // Unset for a loopback run (one process computes rank 0 alone) and in
  // reports from before they were recorded; the error needs both.
  std::optional<double> step_time_measured_s, step_time_predicted_s;
  std::optional<double> step_time_error_pct;  // 100 × (predicted − measured) / measured
  std::vector<RankReport> ranks;
  std::optional<int64_t> max_batch_predicted, max_batch_measured;
  // Where it was measured: memory on the CPU depends on it for bf16, speed
  // always (reports/machine.h). Absent in reports from before it was recorded.
  std::optional<Machine> machine;
  std::string command;  // the command line that made it
  std::string created;  // ISO 8601 date-time
};

// Fills the step-time fields from r.tokens_per_s, the job's global tokens
// per optimizer step (world × batch × grad_accum × seq_len) and the time
// model's step time (nullopt or <= 0: no prediction). Leaves them unset when
// nothing was timed (tokens_per_s or tokens_per_step not > 0).
void set_step_time(RunReport& r, double tokens_per_step, std::optional<double> predicted_step_time_s);

// A rank's peak_error_pct (SPEC): 100 × (predicted − measured) / measured on
// the figure that decides OOM on the device, reserved on CUDA
// (`on_reserved`), allocated on the CPU; nullopt when nothing was measured.
std::optional<double> peak_error_pct(const MemoryFigures& predicted, const MemoryFigures& measured,
                                     bool on_reserved);

nlohmann::json to_json(const RunReport& r);
// Validates the schema tag and the fields; throws std::invalid_argument
// with one line naming `origin` and the field.
RunReport report_from_json(const nlohmann::json& j, const std::string& origin);

}  // namespace shardfit::reports
