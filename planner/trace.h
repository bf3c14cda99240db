// The tracer: builds a model on the meta device and runs one forward, loss
// and backward at the requested batch and sequence length, recording every
// storage allocated and freed (a recording allocator for kMeta), the op that
// made it (a RecordFunction observer), the module and phase it happened in
// (a ModuleRunner with backward callbacks), and the FLOPs of matmul-like ops.
// Where the target device's kernels allocate more than their outputs, the
// trace records that too (meta_kernels.cc: CPU dropout's noise, CPU bf16
// matmuls' oneDNN scratchpads).
// No data is touched, so GPT-2 XL traces in milliseconds, and a new model is
// planned by tracing it: no hand-written activation formulas.
#pragma once

#include <vector>

#include "models/model_config.h"
#include "planner/model_trace.h"

namespace shardfit::planner {

struct TraceOptions {
  int64_t batch = 1;
  int64_t seq_len = 128;
  DType dtype = DType::kF32;  // parameters and compute (mixed precision: the 2-byte type)
  // Modules (indices into the module table) that recompute their forward in
  // backward (activation checkpointing, spec/recompute.h); empty = none.
  std::vector<int> recompute_modules;
  // Whose kernels the meta kernels imitate where allocations differ by
  // device (LayerNorm statistics in fp32 for 2-byte inputs on CUDA; on the
  // CPU, dropout's noise tensor and the oneDNN scratchpad of bf16 matmuls).
  bool target_cuda = true;
  // CPU targets: intra-op threads of the rank the trace stands for. oneDNN
  // books a bf16 matmul's scratchpad (packing buffers, accumulator) per
  // thread, so it grows with the rank's threads. `shardfit run` gives each
  // of N ranks on a host hardware_concurrency / N threads
  // (launch/run.cc); a plan should pass the same. 0 = this process's
  // own at::get_num_threads().
  int cpu_threads = 0;
  // Record op names and matmul FLOPs (a RecordFunction observer on every op;
  // about a third of a trace's time). The planner's batch-1 trace does
  // without: the simulator needs neither, FLOPs come from batches 2 and 3.
  bool record_ops = true;
};

// One traced forward + loss + backward. Throws std::invalid_argument for
// batch < 1 or a sequence the model cannot take.
ModelTrace trace_step(const models::ModelConfig& config, const TraceOptions& options);

// Registers meta-device kernels for the ops LibTorch 1.13 lacks them for
// (embedding, layer norm, dropout and their backward). Each is registered
// only when the running LibTorch has none, so a newer one keeps its own.
// Idempotent; trace_step calls it.
void register_missing_meta_kernels();

}  // namespace shardfit::planner
