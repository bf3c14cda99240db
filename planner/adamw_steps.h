// torch.optim.AdamW's step over parameters other than the ones it was traced
// with: ZeroRedundancyOptimizer's local optimizer holds one rank's partition,
// FSDP's holds flat or per-parameter shards. The trace file records AdamW's
// steps over every parameter (pytorch/trace_recorder.py); these compose the
// step over another list from them, for both of 1.13's implementations
// (torch/optim/adamw.py): the for-loop one (foreach=False, 1.13's default on
// CPU tensors) and the multi-tensor one (foreach=True), and 2.x's fused one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/model_trace.h"

namespace shardfit::planner {

// Which of torch.optim.AdamW's implementations steps (`plan --adamw-step`):
// the for-loop one (foreach=False), the multi-tensor one (foreach=True), or
// the fused one (fused=True: one _fused_adamw_ kernel over the list, which
// allocates nothing; its step counts on the parameters' device). The fused
// step splits as the multi-tensor one does (MultiTensorAdamwStep): its
// state per parameter, and on a CPU the per-tensor add of its step counts.
enum class AdamwStep : uint8_t { kForLoop, kForeach, kFused };
// "for-loop", "foreach", "fused": the option's words and the plan's.
const char* adamw_step_name(AdamwStep s);
// Those words back; anything else: std::nullopt.
std::optional<AdamwStep> parse_adamw_step(const std::string& name);
// The ops one step of `step` dispatches over `tensors` parameters that have
// a gradient, as PyTorch 2.11 runs it on a CPU (torch/optim/adam.py, which
// AdamW's step calls; counted by a TorchDispatchMode around step 2:
// reports/pytorch/step-time-probe.py adamw-ops): the profiler's
// record_function enter and exit around every step, then
//  - for-loop (_single_tensor_adam): per parameter its step count's add_,
//    the weight decay's mul_, lerp_, mul_ and addcmul_ into the moments,
//    the step count read back (_local_scalar_dense), sqrt, div, add_ of eps
//    and addcdiv_ into the parameter: 2 + 10 n;
//  - foreach (_multi_tensor_adam): one _foreach_ op of each kind over the
//    list (add_, mul_ twice, lerp_, addcmul_, sqrt, div_, add_, addcdiv_),
//    a lift_fresh, and per parameter its step count read back twice (the
//    two bias corrections): 12 + 2 n;
//  - fused (_fused_adam): the step counts' _foreach_add_ and one
//    _fused_adamw_: 4.
int64_t adamw_step_ops(AdamwStep step, int64_t tensors);

// foreach=False: one step over `params` (indices, in the local optimizer's
// order) composed from each parameter's step alone (TraceFile::
// optimizer_param_steps: two per parameter, the first and a later one): for
// the first step, every parameter's state (the storages its step keeps)
// before any update, as torch.optim.AdamW.step creates all state, then calls
// the update loop.
ModelTrace compose_optimizer_step(const std::vector<ModelTrace>& per_param_steps, const std::vector<int>& params,
                                  bool first);

// foreach=True (_multi_tensor_adamw): every _foreach_ op runs over the whole
// list, so its per-tensor outputs (the sqrt and the denominator of every
// parameter) are all alive together. A step traced over every parameter is
// split into what its call makes once and what it makes per parameter, in
// the list's order:
//  - once: what a group's first allocation makes as `aten::empty` (the
//    profiler's record_function around step(); the 12 bytes 1.13's CPU
//    loops hold in three _foreach_ ops: planner/meta_kernels.cc);
//  - per parameter, in runs over the list: its state (what the step keeps:
//    step, exp_avg, exp_avg_sq, made in one loop over the parameters, so
//    the same number per parameter), each _foreach_ op's output (freed on
//    return: one per parameter and op, in list order), and each other
//    group of allocations freed within the step (the per-tensor add_ of
//    the host `step` tensors: _foreach_add_'s slow path).
// A trace that does not split so (counts not a multiple of the parameters,
// or not rebuilt exactly) is refused with one line.
class MultiTensorAdamwStep {
 public:
  // `step` traced over parameters of these bytes, in this order, by the
  // multi-tensor AdamW or (`which`) the fused one.
  MultiTensorAdamwStep(const ModelTrace& step, std::vector<int64_t> param_bytes,
                       AdamwStep which = AdamwStep::kForeach);

  // One entry of the list to compose: the traced parameter whose part it
  // repeats, and its bytes (every storage of that parameter's size becomes
  // this size: an FSDP shard; the parameter's own size for a partition).
  struct Entry {
    int param = 0;
    int64_t bytes = 0;
  };
  // The step over `list`, in its order.
  ModelTrace compose(const std::vector<Entry>& list) const;

 private:
  struct Event {
    MemEvent e;
    int owner = -1;  // parameter, or -1: the call's
    int run = -1;    // the run of per-parameter allocations it is in (-1: none)
    bool late_free = false;  // frees a parameter's storage from an earlier run (on return)
  };
  std::vector<Event> events_;
  std::vector<std::vector<std::vector<size_t>>> blocks_;  // [run][parameter]: its events there
  std::vector<int64_t> param_bytes_;
};

}  // namespace shardfit::planner
