// What the tracer hands to the simulator: the model's module tree and the
// storage events of one forward + loss + backward on one rank, recorded on
// the meta device. Nothing here depends on LibTorch, so the simulator, the
// allocator models and their tests build in seconds.
//
// What the trace holds and what it does not:
//  - It holds every activation / temporary storage that the model code
//    allocates and frees, in order, with the op that made it, the innermost
//    module it happened in, and the phase.
//  - It does NOT hold parameters, gradients, optimizer state or
//    communication buffers: those depend on the sharding strategy and are
//    added by the StepSimulator from the ShardLayout. (The tracer pre-sets
//    every parameter's .grad so that AccumulateGrad adds in place, exactly as
//    the executor's flat gradient views make it do; the transient gradient
//    each backward op produces is in the trace, the accumulated one is not.)
//  - Sizes are the storage's nbytes as LibTorch asked its allocator for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/dtype.h"
#include "spec/module_table.h"

namespace shardfit::planner {

enum class Phase : uint8_t {
  kForward,    // forward and loss
  kBackward,   // autograd backward
  kRecompute,  // forward re-run inside backward under activation checkpointing
};

// The module table and dtypes are the spec layer's (LibTorch-free, shared
// with the executor); the trace refers to them by these names.
using spec::DType;
using spec::dtype_bytes;
using spec::BufferInfo;
using spec::ModuleNode;
using spec::ParamInfo;

struct MemEvent {
  enum Kind : uint8_t {
    kAlloc,        // storage `tensor` of `bytes` allocated
    kFree,         // storage `tensor` freed
    kModuleBegin,  // module `module` starts running in `phase`
    kModuleEnd,    // module `module` finished in `phase`
  };
  Kind kind = kAlloc;
  Phase phase = Phase::kForward;
  int module = 0;       // innermost module active (index into modules)
  int64_t tensor = -1;  // storage id, unique within one trace (alloc/free only)
  int64_t bytes = 0;    // alloc only
  int op = -1;          // index into ModelTrace::op_names; -1 when none
};

// The work of one phase as the time model counts it (planner/time_model.h),
// recorded by the op observer beside the FLOPs: every matrix product's shape,
// and what the other leaf ops (the kernels) move, by op.
//  - A matrix product: `count` independent (m x k)(k x n) products (bmm's
//    batch; 1 for mm/addmm), 2·count·m·n·k FLOPs.
//  - A kernel: a leaf op that is not a matrix product nor a view
//    (trace_recorder.cc's list); its bytes are its tensor inputs plus what
//    it allocated, the memory it reads and writes as a roofline counts it.
//  - nodes: autograd nodes run. Each node and kernel is a dispatch: the
//    per-op overhead that dominates a step of small tensors.
struct GemmShape {
  int64_t count = 1, m = 0, n = 0, k = 0;
  double flops() const {
    return 2.0 * static_cast<double>(count) * static_cast<double>(m) * static_cast<double>(n) *
           static_cast<double>(k);
  }
  bool operator==(const GemmShape& o) const { return count == o.count && m == o.m && n == o.n && k == o.k; }
};

struct KernelWork {
  std::string op;  // "aten::tanh"
  int64_t calls = 0;
  double bytes = 0;  // over all calls
};

struct PhaseWork {
  std::vector<GemmShape> gemms;     // in execution order
  std::vector<KernelWork> kernels;  // one per op name, sorted by name
  int64_t nodes = 0;
  int64_t ops() const {
    int64_t n = nodes;
    for (const auto& k : kernels) n += k.calls;
    return n;
  }
  bool empty() const { return gemms.empty() && kernels.empty() && nodes == 0; }
  void add_kernel(const std::string& op, double bytes) {
    auto it = kernels.begin();
    while (it != kernels.end() && it->op < op) ++it;
    if (it == kernels.end() || it->op != op) it = kernels.insert(it, KernelWork{op, 0, 0});
    ++it->calls;
    it->bytes += bytes;
  }
};

// Module begin/end events in the backward phase come from identity autograd
// nodes on each module's output (begin) and input (end), i.e. they bracket
// exactly the autograd work of that module, as FSDP's pre/post-backward
// hooks do.
struct ModelTrace {
  std::string model_name;
  int64_t batch = 0;    // sequences per rank
  int64_t seq_len = 0;
  DType compute_dtype = DType::kF32;
  std::vector<int> recompute_modules;  // modules recomputed in backward (sorted)
  // How they were checkpointed (traces from Python): torch.utils.checkpoint
  // with use_reentrant=True (a CheckpointFunction re-running the module and
  // its own backward inside the outer one) or False (saved-tensor hooks).
  bool recompute_reentrant = false;
  // Traces from Python: fp32 parameters, the forward (and loss) run under
  // torch.autocast(compute_dtype) (pytorch/trace_recorder.py --autocast):
  // PyTorch's mixed precision, not a model held in compute_dtype.
  bool autocast = false;
  // Storages the forward returned beside the loss (a Hugging Face model's
  // output object: logits, past keys and values), which a training loop
  // holding that object (`outputs = model(**batch)`) keeps until its next
  // forward returns. Allocated in the trace and never freed in it (their
  // frees, when the recorder dropped the output, are left out).
  std::vector<int64_t> kept_outputs;
  // The bytes of each tensor the forward returned that has a grad_fn, in
  // torch.utils._pytree.tree_flatten order: what DDP(static_graph=True)'s
  // first iteration clones (distributed.py _DDPSink). Traces from Python.
  std::vector<int64_t> output_tensor_bytes;
  // true: every parameter's .grad exists when the step starts, so
  // AccumulateGrad adds in place and the trace holds only transients (the
  // shardfit engine's flat gradient views; PyTorch from step 2 when zero_grad
  // keeps grads). false: .grad is None (PyTorch's first step, or after
  // zero_grad(set_to_none=True)): AccumulateGrad keeps the gradient an op
  // made, so the trace ends with the gradients live.
  bool grads_at_start = true;
  std::vector<ModuleNode> modules;  // modules[0] is the root
  std::vector<MemEvent> events;
  std::vector<std::string> op_names;
  double forward_flops = 0;    // multiply-adds × 2 of matmul-like ops in forward
  double backward_flops = 0;   // same, in backward (and recompute)
  // The same phases' work by op (PhaseWork); empty when ops were not recorded
  // (TraceOptions::record_ops) or the trace file predates the field.
  PhaseWork forward_work, backward_work;
  int64_t param_numel() const {
    int64_t n = 0;
    for (const auto& m : modules)
      for (const auto& p : m.params) n += p.numel;
    return n;
  }
};

}  // namespace shardfit::planner
