// `shardfit plan --stack pytorch` for PyTorch's FullyShardedDataParallel:
// torch.distributed.fsdp as of 1.13
// (Debian's python3-torch; its source, torch/distributed/fsdp/
// fully_sharded_data_parallel.py and flat_param.py, is what each rule below
// cites), wrapping by size_based_auto_wrap_policy(min_num_params),
// FULL_SHARD or SHARD_GRAD_OP, CPUOffload(offload_params) or not, with
// MixedPrecision(param_dtype = buffer_dtype, reduce_dtype the same or fp32,
// keep_low_precision_grads or not) or not, with
// torch.optim.AdamW over the flat parameters, in the loop
//     opt.zero_grad(); loss = model(x)[0]; loss.backward(); opt.step()
// on CUDA ranks (1.13's FSDP runs only there), through the CUDA caching
// allocator's model with one pool per stream FSDP uses. Checked by hand
// against 1.13's source; torch 2.11's FSDP1 on an H200 measured otherwise
// (reports/gpu/README.md: its own kernels and allocator), not yet modelled.
// NO_SHARD, and a world size of 1 as NO_SHARD, as FSDP clamps it. On CPU
// ranks over Gloo, torch 2.11's FSDP1 is held against real jobs
// (scripts/pytorch-validate's fsdp1 wraps). Which actions its hooks take,
// and in which order, is spec::Schedule's (spec/schedule.h,
// Runtime::kTorchFsdp1); the .cc says what each action allocates here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/allocator_model.h"
#include "planner/model_trace.h"
#include "planner/pytorch_stack.h"
#include "planner/pytorch_walk.h"
#include "planner/step_simulator.h"
#include "spec/schedule.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

struct PytorchFsdpOptions {
  // ShardingStrategy.FULL_SHARD (parameters freed after each unit's forward
  // and gathered again for its backward) or SHARD_GRAD_OP (kept from the
  // forward until the unit's backward is done).
  bool reshard_after_forward = true;
  // ShardingStrategy.NO_SHARD (the plan's ddp with an auto wrap policy):
  // every unit's flat parameter whole on each rank, its gradient
  // all-reduced. A world of one runs so whatever the strategy.
  bool no_shard = false;
  bool offload_params = false;  // CPUOffload(offload_params=True): shards, grads and AdamW on the host
  // auto_wrap_policy: size_based_auto_wrap_policy(min_num_params) (kSize;
  // its default 1e8), or transformer_auto_wrap_policy with the trace's block
  // class as transformer_layer_cls (kBlock: wrap.py wraps every instance and
  // recurses everywhere else; the root wraps what remains).
  spec::WrapPolicy wrap{spec::WrapPolicy::Kind::kSize, 100000000};
  // BackwardPrefetch: BACKWARD_PRE (gather the next unit when this unit's
  // backward starts), BACKWARD_POST (when it ends) or none.
  using Prefetch = FsdpBackwardPrefetch;
  Prefetch backward_prefetch = Prefetch::kBackwardPre;
  // FSDP(forward_prefetch=True) (`--prefetch 2`): each unit's pre-forward
  // gathers the next unit in the forward order the first iteration recorded
  // (_ExecOrderData, forward_prefetch_limit 1), so from step 2 on.
  bool forward_prefetch = false;
  // MixedPrecision(param_dtype=d, reduce_dtype=d, buffer_dtype=d), d bf16
  // or fp16 (with grad_scaler), or none (kF32). With one, the traces are
  // the model's cast to d (trace_recorder.py --param-dtype): FSDP computes
  // with the gathered low-precision flat parameter (NO_SHARD: the whole one
  // cast), so activations and the parameters' gradients are d; the shards,
  // the reduced gradient shards and AdamW stay fp32.
  DType mixed_precision = DType::kF32;
  // MixedPrecision(reduce_dtype=d) (`--fsdp-reduce-dtype`), d other than
  // the dtype the gradients are computed in (param_dtype, or fp32 without
  // one): the flat gradient cast to d before its reduce-scatter, which then
  // runs in d; the reduced shard cast to fp32 unless d is. None: reduced
  // in param_dtype.
  std::optional<DType> reduce_dtype;
  // MixedPrecision(keep_low_precision_grads=True) (`--fsdp-keep-low-precision-
  // grads`): _finalize_params casts each reduced fp32 shard to param_dtype
  // for the optimizer.
  bool keep_low_precision_grads = false;
  // FullyShardedDataParallel(use_orig_params=True) (`--fsdp-use-orig-params`):
  // AdamW steps the original parameters, each a view of its part of the
  // rank's shard, so the ranks differ: simulated for `rank`.
  bool use_orig_params = false;
  int rank = 0;
  // ShardedGradScaler around the step (fp16 MixedPrecision, as FSDP's docs
  // pair them: torch/distributed/fsdp/sharded_grad_scaler.py): its scale and
  // growth tracker from the first scale(), unscale_'s tensors around the
  // optimizer step (grad_scaler_unscale, the gradients on the host with
  // offload_params). The traces carry the scaled loss's backward.
  bool grad_scaler = false;
  // CPU ranks (Gloo, FullyShardedDataParallel(device_id=cpu)): no caching
  // allocator, so the construction's transients count (the .cc's init).
  bool cpu = false;
  int world_size = 2;
  int steps = 2;
  int64_t budget_bytes = kUnlimitedBytes;
  std::vector<int64_t> overhead_bytes;  // the profile's cuBLAS workspaces
  bool zero_grad_set_to_none = true;    // opt.zero_grad(set_to_none=...)
  bool keep_outputs = true;             // PytorchDdpOptions::keep_outputs
};

// The streams whose pools the caching allocator keeps apart (a block freed
// on one is not reused by another): the default (compute) stream and the
// three FSDP creates in _init_streams.
enum FsdpStream : int { kFsdpComputeStream = 0, kAllGatherStream = 1, kPostBackwardStream = 2, kPreAllGatherStream = 3 };

// One rank's init and `steps` steps; `in` as for simulate_pytorch_ddp (its
// no-grads traces and per-parameter optimizer steps are used), `modules` the
// trace file's module table.
StepSimResult simulate_pytorch_fsdp(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                    const PytorchFsdpOptions& options, AllocatorModel& allocator);

// What FSDP1 and FSDP2 (`who`) need of the trace file and the options: the
// no-grads traces and each parameter's optimizer steps, a world and a step.
// Else std::invalid_argument.
void check_fsdp_request(const PytorchDdpInputs& in, int world_size, int steps, const std::string& who);

// The schedule of PyTorch's FSDP or DDP (`options.runtime`: spec::Runtime::
// kTorchFsdp1, kTorchFsdp2 or kTorchDdp) whose units shard as `sharding`
// does (FULL_SHARD and reshard_after_forward=True: zero3; SHARD_GRAD_OP and
// False: zero2; NO_SHARD: ddp; DDP: ddp, or zero1 under
// ZeroRedundancyOptimizer), `options` checked; a DDP sharding anything but
// the optimizer's state is std::invalid_argument.
spec::Schedule pytorch_schedule(spec::Sharding sharding, const spec::ScheduleOptions& options);

// Runs `schedule`'s actions of `hook` for `unit` (-1: the step's own hooks,
// kZeroGrad and kBackwardEnd; unit 0 is the root) in the step's last
// micro-batch or not, through `apply`, told whether the hook is the
// forward's, until one runs out of memory.
void run_schedule_hook(const spec::Schedule& schedule, spec::Hook hook, int unit, const Ledger& ledger,
                       const std::function<void(spec::Op op, bool forward)>& apply, bool last_micro_batch = true);

// A unit's flat parameter, padded and sharded (flat_param.py _get_shard:
// torch.chunk into world_size pieces, each rank's padded to the first's
// numel): the shard's numel, ceil(numel / world).
inline int64_t fsdp_shard_numel(int64_t numel, int world) { return (numel + world - 1) / world; }
// What each rank holds of a unit's flat parameter: its shard, or under
// NO_SHARD the whole (unpadded) flat parameter.
inline int64_t fsdp1_rank_numel(int64_t numel, int world, bool no_shard) {
  return no_shard ? numel : fsdp_shard_numel(numel, world);
}

// AdamW over shards (defined in pytorch_fsdp_shards.cc, shared with FSDP2's
// fully_shard in pytorch_fsdp2.h): torch.optim.AdamW over shards of these
// sizes (elements; a 0 is skipped), in this order, from the traced steps of
// one parameter alone (`in`'s optimizer_param_steps), resized: its first
// step (state created) and any later one.
struct ShardedAdamw {
  ModelTrace first, later;
};
ShardedAdamw sharded_adamw_steps(const PytorchDdpInputs& in, const std::vector<int64_t>& shards);

// What AdamW steps on `rank` under FSDP1, in elements (0: nothing to step):
// each unit's flat shard, or with use_orig_params each original parameter's
// part of its unit's shard (_use_sharded_views), in model.parameters() order
// (the module table's, each module's own parameters); a parameter with no
// part there has no gradient (_use_sharded_grad_views), so no state.
std::vector<int64_t> fsdp1_optimized_shards(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part,
                                            int world, int rank, bool no_shard, bool use_orig_params);

}  // namespace shardfit::planner
