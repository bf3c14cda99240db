// One training job as every layer takes it, beyond its model and candidate:
// its sizes and how its collectives are scheduled. `plan` simulates such a
// job and `run` executes it, so both read it the same way:
//  - the CLI parses each option once (plan's and run's --seq-len, --steps,
//    --grad-accum, --prefetch, --async-reduce, --async-gather,
//    --ddp-bucket-cap-mb; a plan file's fields for `run --plan`);
//  - check_job_options checks it once, each rule with its one message naming
//    the option as the CLI spells it;
//  - the planner (planner::PlanRequest), the launcher (launch::Job) and the
//    trainers (executor::TrainOptions, and so EngineOptions) take JobOptions
//    as their base, and each checks it again with the same rules, for
//    callers that reach them directly (tests, a plan file, the Python stack).
// The batch is not in it: `plan` searches it and `run` takes it, and the
// world is the planner's (--gpus x --nodes) or the ranks' (torchrun's): each
// has its own rule below, used wherever it is read.
//
// The bounds: beyond them a size overflows downstream (batch x seq-len x
// world tokens) or the machine is swamped; a plan would only spend time and
// memory on a job no one runs.
#pragma once

#include <cstdint>

#include "spec/schedule.h"

namespace shardfit::spec {

constexpr long long kMaxBatch = 1 << 20;
constexpr long long kMaxSeqLen = 1 << 20;
constexpr long long kMaxSteps = 1'000'000'000;
constexpr long long kMaxLocalRanks = 1024;  // run --nproc, even with --oversubscribe
constexpr long long kMaxWorld = 1 << 20;
// A node of up to 1,024 GPUs (a rack-scale NVLink domain is 72), up to
// 65,536 nodes, up to 4,096 micro-batches a step.
constexpr long long kMaxGpusPerNode = 1024;
constexpr long long kMaxNodes = 65536;
constexpr long long kMaxGradAccum = 4096;

struct JobOptions {
  // --seq-len: tokens per sequence (the model's positions bound it too:
  // models::check_seq_len).
  int64_t seq_len = 128;
  // --steps: optimizer steps the job runs. The planner reads it only for
  // --stack pytorch (1: a one-step job; 2 or more: its steady state).
  int64_t steps = 10;
  // --grad-accum: micro-batches per optimizer step; a batch is a micro-batch.
  int64_t grad_accum = 1;
  // --prefetch, --async-reduce, --async-gather, --ddp-bucket-cap-mb.
  ScheduleOptions schedule;
};

// Every rule of a JobOptions: check_seq_len, check_steps, check_grad_accum
// and check_schedule_options. Throws std::invalid_argument (one line).
void check_job_options(const JobOptions& job);

// Each rule alone, from 1 to its bound above; each throws
// std::invalid_argument with "--OPTION N: ..." (one line).
void check_batch(int64_t batch);            // --batch: sequences per GPU (rank) per micro-batch
void check_seq_len(int64_t seq_len);        // --seq-len
void check_steps(int64_t steps);            // --steps
void check_grad_accum(int64_t grad_accum);  // --grad-accum
// plan's --gpus, run's --gpus-per-node (`option` names it).
void check_gpus_per_node(int64_t gpus, const char* option = "--gpus");
void check_nodes(int64_t nodes);            // plan's --nodes

}  // namespace shardfit::spec
