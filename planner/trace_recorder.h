// The tracer's machinery, for whoever runs the model: the C++ tracer
// (planner/trace.cc, for built-in models) and a Python process tracing a
// model written in Python (pytorch/trace_capi.cc). While a
// TraceRecording is alive, every meta-device storage allocated and freed is
// recorded into its ModelTrace (a recording allocator for kMeta), with the op
// that made it (a RecordFunction observer), the innermost module and the
// phase, which the runner reports through the static calls below.
//
// One recording per thread, any number of threads at once: the recording
// allocator is the process's, but each allocation, op and module boundary
// goes to the recording of the thread it happens on. That holds because
// LibTorch runs a meta (or CPU) graph's backward on the thread that calls
// backward (torch/csrc/autograd/engine.cpp, Engine::ready_queue: the CPU
// queue for kCPU and kMeta, executed by the caller in
// Engine::execute_with_graph_task); a CUDA device's backward would run on
// the engine's device thread and is never recorded here.
#pragma once

#include <memory>

#include "planner/model_trace.h"

namespace shardfit::planner {

struct RecorderOptions {
  // Op names and matmul FLOPs (TraceOptions::record_ops).
  bool record_ops = true;
  // > 0: record the oneDNN scratchpads of CPU bf16 matrix products for this
  // many threads (meta_kernels.cc). 0: none (fp32, CUDA targets).
  int cpu_bf16_threads = 0;
  // Whose kernels the meta kernels imitate (TraceOptions::target_cuda).
  bool target_cuda = true;
  // CPU targets traced with the host storages recorded (host_storage(): the
  // Python recorder): also record the one-element cast of a Python number
  // that the CPU's TensorIterator makes for a binary op (below).
  bool record_host_storages = false;
};

struct Recorder;  // trace_recorder.cc

class TraceRecording {
 public:
  // Records into `trace` what this thread allocates (throws when this thread
  // already records); nothing is recorded until start(), so the model can
  // be built first.
  TraceRecording(ModelTrace* trace, const RecorderOptions& options);
  ~TraceRecording();  // stops
  void start();
  TraceRecording(const TraceRecording&) = delete;
  TraceRecording& operator=(const TraceRecording&) = delete;

  // Module `m` (index into trace->modules) starts / ends its forward.
  static void forward_begin(int m);
  static void forward_end(int m);
  // Backward reaches module `m`'s output (begin: the phase becomes backward)
  // / its inputs (end).
  static void backward_begin(int m);
  static void backward_end(int m);
  // Checkpointed module `m` re-runs its forward inside backward.
  static void recompute_begin(int m);
  static void recompute_end(int m);
  // A host storage at `data` of `bytes` was allocated (bytes > 0) or freed
  // (bytes = 0) while recording: for a CPU target the host is the device,
  // and what the kernels of a meta trace allocate there (scalars wrapped as
  // 0-dim tensors) is what they allocate in the real run. Frees of storages
  // not recorded are ignored.
  static void host_storage(const void* data, int64_t bytes);
  // Backward starts (the loss's backward is called).
  static void begin_backward_phase();
  // Modules whose inputs need no gradient (embeddings, the root) have no
  // backward-end callback: their backward ends with the whole backward.
  static void end_open_backwards();

 private:
  std::unique_ptr<Recorder> rec_;
  void* handle_ = nullptr;
};

// Registers meta-device kernels that allocate what the target's kernels do
// (trace.h register_missing_meta_kernels). With `override_existing` they
// replace kernels registered before (Python's torch registers decompositions
// as meta kernels at import, whose temporaries are not the CPU kernels').
void register_meta_kernels(bool override_existing);
void set_meta_kernels_target_cuda(bool cuda);

}  // namespace shardfit::planner
