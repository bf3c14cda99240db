// The schedule: what a strategy does at each hook of a training step, as an
// ordered list of actions on wrap units, decided here once from the
// strategy's traits. Two interpreters replay it: the step simulator
// (planner/step_simulator.cc) against the allocator model, charging each
// action's buffers, and the engine (executor/engine.cc) against tensors and
// a communicator (executor/flat_param.h). Neither decides on its own which
// actions a strategy takes at a hook; each says only what an action
// allocates and does, and the accuracy matrix checks the two agree to the
// byte. PyTorch's own DDP, FSDP1 and FSDP2, as `plan --stack pytorch`
// simulates them (planner/pytorch_ddp.cc, pytorch_fsdp.cc,
// pytorch_fsdp2.cc), replay it too, in PyTorch's order (Runtime, below),
// checked against real torch 2.11 jobs by scripts/pytorch-validate.
//
// The hooks are FSDP2's (torch/distributed/_composable/fsdp/_fsdp_state.py:
// _pre_forward, _post_forward, _pre_backward, _post_backward; the root's
// _root_post_backward_final_callback ends backward), plus the step's own
// boundaries. With P_u a unit's padded flat numel, s_u = P_u / N its shard
// and c the compute dtype's bytes, the actions are:
//   kGather           SHARDED -> UNSHARDED: a c*s_u staging copy of the shard
//                     when the gather is staged (mixed or offload), then an
//                     all-gather into c*P_u, the staging copy freed once it
//                     is done; when already UNSHARDED, nothing, or (a
//                     prefetch in flight, async_gather) its wait and the
//                     staging copy freed.
//   kReshard          UNSHARDED -> SHARDED: the gathered storage freed.
//   kPrefetchForward  kGather for the next prefetch - 1 units in forward
//                     order (FSDP's forward_prefetch), once a forward has
//                     recorded that order (as FSDP records it in its first
//                     iteration); only with --prefetch 2 or more.
//   kPrefetchBackward kGather for the next `prefetch` units in backward
//                     order: those that ran forward just before this one
//                     (1: FSDP's BACKWARD_PRE, the default).
//   kAllocGrad        the unsharded c*P_u grad autograd accumulates into.
//   kReduceScatter    the unsharded grad reduce-scattered into the fp32 shard
//                     grad 4*s_u (through a c*s_u output when mixed or
//                     offload; added to it from the second micro-batch), then
//                     all-reduced across replica groups (hybrid); the
//                     unsharded grad freed.
//   kAllReduce        ddp/zero1, on the last micro-batch only (DDP's
//                     no_sync): at kGradReady, the bucket's slice of the flat
//                     grad averaged in place (spec/grad_buckets.h); when
//                     backward ends, every bucket not launched yet (its
//                     parameters got no gradient: DDP's find_unused_parameters
//                     marks them ready then).
//   kWaitReduce       every reduction launched so far completes: the shard
//                     grad takes its result (the c*s output upcast into it,
//                     or copied to the host), the unsharded grad is freed;
//                     ddp/zero1: a unit whose every bucket is reduced is
//                     done (zero1+offload copies this rank's slice to the
//                     host).
// kReduceScatter and kAllReduce launch a reduction: its output (the fp32
// shard grad 4*s_u, or a c*s_u output when mixed or offload) is allocated
// then, and everything else happens at the next kWaitReduce. Synchronous
// (the default), the wait follows the launch at once. With async_reduce
// (--async-reduce) the reduction runs beside the rest of backward, as
// FSDP2's and DDP's do: a sharded unit's post-backward first waits for the
// reduction the previous unit launched (FSDP2 keeps one reduce-scatter in
// flight: FSDPParamGroup.post_backward waits for comm_ctx.
// reduce_scatter_state's event before foreach_reduce issues the next), so
// that unit's unsharded grad stays allocated through this unit's backward;
// DDP's buckets are all in flight at once and are waited for when backward
// ends (reducer.cpp's finalize_backward), which costs nothing: they reduce
// the flat grad in place. A bucket is launched when its last gradient
// arrives (kGradReady), which need not be when a unit's backward ends: the
// buckets are sized by --ddp-bucket-cap-mb, not by the wrap policy.
//   kAllocFlatGrad    ddp/zero1: one c*sum(P_u) flat grad buffer for every
//                     unit (DDP's gradient_as_bucket_view), created when the
//                     first backward starts and kept.
//   kZeroFlatGrad     ddp/zero1: the flat grad zeroed in place.
//   kFreeShardGrad    zero2/3/hybrid: the shard grad freed (zero_grad with
//                     set_to_none=True).
//   kRebuildBuckets   PyTorch's DDP only (below): Reducer::rebuild_buckets.
//   kBroadcastBuffers PyTorch's DDP only: DDP._sync_buffers.
//   kCloneOutputs     PyTorch's DDP only: _DDPSink's clones.
// The optimizer step (AdamW per unit, its lazily created state and
// temporaries) is one hook, interpreted whole by each side.
//
// PyTorch's own FSDP takes the same actions at the same hooks, in its own
// order where it differs (build_torch in the .cc; the planner's
// pytorch_fsdp.cc and pytorch_fsdp2.cc interpret them):
//  - no step-level flat grad and no gradient bucket: autograd makes the
//    parameters' gradients (they are in the model's trace); reductions
//    always run beside backward, whatever async_reduce says;
//  - FSDP2 (Runtime::kTorchFsdp2, torch 2.11 _fsdp_param_group.py): a
//    unit's post-backward reshards first, then drops the previous unit's
//    reduce-scatter input (kWaitReduce: FSDPCommContext.
//    reduce_scatter_state) and reduce-scatters; with
//    reshard_root_after_forward the root too reshards after its forward
//    (2.11 does when the root's fully_shard names reshard_after_forward, as
//    every exported script does);
//  - FSDP1 (Runtime::kTorchFsdp1, FullyShardedDataParallel,
//    _runtime_utils.py): a unit's post-backward makes the flat gradient from
//    its parameters' (kAllocGrad), reshards, prefetches when
//    backward_prefetch is BACKWARD_POST, waits for the previous unit's
//    reduce-scatter to release that unit's flat gradient and
//    reduce-scatters; NO_SHARD (the ddp traits) all-reduces its unit's
//    gradient there instead, and reshards after every forward (its
//    low-precision copy);
//  - in both, kZeroGrad drops every unit's gradient (zero_grad) and
//    kBackwardEnd waits for what is still in flight;
//  - DDP (Runtime::kTorchDdp, DistributedDataParallel and its Reducer,
//    distributed.py / reducer.cpp; ZeroRedundancyOptimizer is DDP with its
//    own optimizer step) has one unit, the model root. kZeroGrad drops every
//    .grad (kFreeShardGrad, under set_to_none). The root's pre-forward
//    (DDP.forward before the module runs) rebuilds the buckets once the
//    first synced backward has recorded the gradients' order
//    (kRebuildBuckets), then broadcasts the buffers when the forward before
//    it synced (kBroadcastBuffers); its post-forward (DDP.forward after the
//    module returned) clones the outputs in the reducer's first
//    static-graph iteration (kCloneOutputs). A bucket's all-reduce runs in
//    place and allocates nothing, so the schedule launches every bucket at
//    kBackwardEnd (kAllReduce) and waits there (kWaitReduce: the .grads
//    take the result, copied back or as views of the buckets), on the last
//    micro-batch only: the others run under no_sync.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "spec/grad_buckets.h"
#include "spec/strategy.h"

namespace shardfit::spec {

enum class Hook : uint8_t {
  kZeroGrad,       // a step begins (before its first micro-batch)
  kPreForward,     // a unit's root module's outermost forward begins
  kPostForward,    // ... and ends
  kBackwardStart,  // a micro-batch's backward begins (the loss's gradient)
  kPreBackward,    // a unit's output gradient is ready (its first backward span)
  kRecompute,      // a unit's checkpointed forward re-runs inside backward
  kPostBackward,   // a unit's last backward span ends
  kGradReady,      // ddp/zero1: a gradient bucket's last gradient arrived (the
                   // bucket's, not a unit's: spec/grad_buckets.h)
  kBackwardEnd,    // a micro-batch's backward is over (FSDP's root post-backward
                   // final callback) and its loss and batch are freed
};
inline constexpr int kNumHooks = 9;

enum class Op : uint8_t {
  kGather,
  kReshard,
  kPrefetchForward,
  kPrefetchBackward,
  kAllocGrad,
  kReduceScatter,
  kAllReduce,
  kAllocFlatGrad,
  kZeroFlatGrad,
  kFreeShardGrad,
  kWaitReduce,
  kRebuildBuckets,
  kBroadcastBuffers,
  kCloneOutputs,
};
const char* op_name(Op op);

// Where in the step a hook runs, beyond the strategy.
struct HookContext {
  bool root = false;             // the unit rooted at the model root (backward needs it first)
  bool last_micro_batch = true;  // the step's last micro-batch (gradient accumulation)
};

// Whose hooks a schedule follows: shardfit's engine, or PyTorch's FSDP1,
// FSDP2 or DDP (the orders above).
enum class Runtime : uint8_t { kEngine, kTorchFsdp1, kTorchFsdp2, kTorchDdp };

// When a unit's backward prefetch is issued: FSDP1's BackwardPrefetch
// (BACKWARD_PRE as its backward begins, the engine's and FSDP2's only
// choice; BACKWARD_POST once its own gradient is made and it is resharded;
// or never).
enum class BackwardPrefetch : uint8_t { kNone, kBackwardPre, kBackwardPost };

// How a strategy's collectives are scheduled beyond what its traits say:
// plan's and run's --prefetch, --async-reduce and --async-gather, carried
// together from the command line to both interpreters and the time model.
struct ScheduleOptions {
  // Units gathered ahead of the one that runs: in backward this many (1 =
  // FSDP's BACKWARD_PRE, its default), in forward one fewer; 0 = none.
  // Matters for zero3/hybrid: zero2 keeps every unit gathered from its
  // forward through its backward anyway.
  int prefetch = 1;
  // Gradients reduce beside the rest of backward (kWaitReduce above).
  bool async_reduce = false;
  // A prefetched unit's all-gather runs beside compute, waited for at that
  // unit's own kGather; its staging copy (mixed, offload) lives until then.
  bool async_gather = false;
  // ddp/zero1: DDP's bucket_cap_mb in bytes (--ddp-bucket-cap-mb), the size
  // the gradient buckets close at (the first at 1 MiB): spec/grad_buckets.h.
  int64_t ddp_bucket_cap_bytes = kDdpBucketCapBytes;
  // Whose hooks (Runtime): the engine's unless a simulation of PyTorch's
  // own DDP or FSDP asks for torch's.
  Runtime runtime = Runtime::kEngine;
  // kTorchFsdp2, zero3/hybrid: the root unit too resharded after its
  // forward, and gathered again when its backward begins.
  bool reshard_root_after_forward = false;
  // kTorchFsdp1 only may move or drop the backward prefetch.
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
};

// The most units a job gathers ahead (--prefetch): more than any model has
// units (a 405B Llama wrapped by block has 126), so a bound only on typos.
inline constexpr int kMaxPrefetch = 1024;

// The rules of a job's ScheduleOptions, each with its one message naming
// the option as the CLI spells it: --prefetch from 1 (0, no prefetch at
// all, is the schedule's own case for tests, not a job's) to kMaxPrefetch,
// a DDP bucket from one byte to 1e6 MB (check_bucket_cap_bytes), the root
// resharded after forward only under kTorchFsdp2 (the engine's root keeps
// its parameters for backward, which needs them first), a backward prefetch
// other than BACKWARD_PRE only under kTorchFsdp1. Throws
// std::invalid_argument. What checks a job's options: the CLI before any
// work, build_plan and the engine for callers that reach them directly.
void check_schedule_options(const ScheduleOptions& options);

// The schedule of one strategy.
class Schedule {
 public:
  // Without async_gather a prefetch gathers early (FSDP's memory) without
  // overlapping compute. A unit's own gather, when nothing prefetched it,
  // is always waited for at once: it is needed now.
  explicit Schedule(const StrategyTraits& traits, const ScheduleOptions& options = {});
  Schedule() = default;  // no actions at all, until assigned

  // The actions of `hook` for a unit, in order. kZeroGrad and kBackwardStart
  // belong to the step: their actions act on every unit (kFreeShardGrad) or
  // on the one flat grad.
  // A reference into a table built once: the simulator asks for every
  // hook of every candidate's batch search.
  const std::vector<Op>& actions(Hook hook, const HookContext& where) const {
    return table_[static_cast<int>(hook) * 4 + (where.root ? 2 : 0) + (where.last_micro_batch ? 1 : 0)];
  }

  const StrategyTraits& traits() const { return traits_; }
  const ScheduleOptions& options() const { return options_; }
  int prefetch() const { return options_.prefetch; }
  bool async_reduce() const { return options_.async_reduce; }
  bool async_gather() const { return options_.async_gather; }

  // Which units a prefetch action gathers, as positions in the order units
  // first ran forward (`count` of them known): the k-th (k = 1, 2, ...) the
  // unit at `pos` prefetches, or -1 when there is no k-th. kPrefetchForward
  // goes forward, prefetch - 1 deep; kPrefetchBackward goes back (the units
  // that ran forward just before run backward next), prefetch deep.
  int prefetch_position(Op op, int pos, int k, int count) const {
    const bool forward = op == Op::kPrefetchForward;
    if (k > (forward ? options_.prefetch - 1 : options_.prefetch)) return -1;
    const int at = forward ? pos + k : pos - k;
    return at >= 0 && at < count ? at : -1;
  }

 private:
  std::vector<Op> build(Hook hook, const HookContext& where) const;
  std::vector<Op> build_torch(Hook hook, const HookContext& where) const;
  std::vector<Op> build_torch_ddp(Hook hook, const HookContext& where) const;

  StrategyTraits traits_;
  ScheduleOptions options_;
  std::array<std::vector<Op>, kNumHooks * 4> table_;  // by hook, root, last micro-batch
};

}  // namespace shardfit::spec
