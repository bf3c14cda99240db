// The bounds of a job's sizes, and the rules that check them, each with its
// one message naming the option as the CLI spells it. Beyond the bounds a
// size overflows downstream (batch x seq-len x world tokens) or the machine
// is swamped; a plan would only spend time and memory on a job no one runs.
// Every command (plan, run, validate) and every layer that takes a job
// directly (build_plan, the engine) checks with these, so a value is
// refused with the same line wherever it comes from: the command line or a
// plan file.
#pragma once

#include <cstdint>

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

// --grad-accum: micro-batches per optimizer step, from 1 to kMaxGradAccum.
// Throws std::invalid_argument.
void check_grad_accum(int64_t grad_accum);
// --steps: training steps, from 1 to kMaxSteps. Throws std::invalid_argument.
void check_steps(int64_t steps);

}  // namespace shardfit::spec
