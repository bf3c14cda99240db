#include "spec/schedule.h"

#include <stdexcept>
#include <string>

namespace shardfit::spec {

const char* op_name(Op op) {
  switch (op) {
    case Op::kGather:
      return "gather";
    case Op::kReshard:
      return "reshard";
    case Op::kPrefetchForward:
      return "prefetch-forward";
    case Op::kPrefetchBackward:
      return "prefetch-backward";
    case Op::kAllocGrad:
      return "alloc-grad";
    case Op::kReduceScatter:
      return "reduce-scatter";
    case Op::kAllReduce:
      return "all-reduce";
    case Op::kAllocFlatGrad:
      return "alloc-flat-grad";
    case Op::kZeroFlatGrad:
      return "zero-flat-grad";
    case Op::kFreeShardGrad:
      return "free-shard-grad";
    case Op::kWaitReduce:
      return "wait-reduce";
    case Op::kRebuildBuckets:
      return "rebuild-buckets";
    case Op::kBroadcastBuffers:
      return "broadcast-buffers";
    case Op::kCloneOutputs:
      return "clone-outputs";
  }
  return "?";
}

void check_schedule_options(const ScheduleOptions& options) {
  if (options.prefetch < 1)
    throw std::invalid_argument("--prefetch " + std::to_string(options.prefetch) + ": must be at least 1");
  if (options.prefetch > kMaxPrefetch)
    throw std::invalid_argument("--prefetch " + std::to_string(options.prefetch) + ": at most " +
                                std::to_string(kMaxPrefetch) + " (units gathered ahead; no model has that many)");
  check_bucket_cap_bytes(options.ddp_bucket_cap_bytes);
  if (options.reshard_root_after_forward && options.runtime != Runtime::kTorchFsdp2)
    throw std::invalid_argument("reshard_root_after_forward: only PyTorch's fully_shard reshards the root after its "
                                "forward; shardfit's engine keeps it for backward");
  if (options.backward_prefetch != BackwardPrefetch::kBackwardPre && options.runtime != Runtime::kTorchFsdp1)
    throw std::invalid_argument("backward_prefetch: only PyTorch's FullyShardedDataParallel prefetches after a "
                                "unit's backward or not at all; shardfit's engine and fully_shard prefetch as it begins");
}

Schedule::Schedule(const StrategyTraits& traits, const ScheduleOptions& options) : traits_(traits), options_(options) {
  for (int h = 0; h < kNumHooks; ++h)
    for (int root = 0; root < 2; ++root)
      for (int last = 0; last < 2; ++last)
        table_[h * 4 + root * 2 + last] = build(static_cast<Hook>(h), HookContext{root == 1, last == 1});
}

std::vector<Op> Schedule::build(Hook hook, const HookContext& where) const {
  if (options_.runtime != Runtime::kEngine) return build_torch(hook, where);
  const bool sharded = traits_.shard_params;
  switch (hook) {
    case Hook::kZeroGrad:
      if (sharded) return {Op::kFreeShardGrad};
      return {Op::kZeroFlatGrad};
    case Hook::kPreForward:
      // zero2 and the zero3 root are still gathered from an earlier call:
      // kGather is then nothing.
      if (sharded && options_.prefetch >= 2) return {Op::kGather, Op::kPrefetchForward};
      if (sharded) return {Op::kGather};
      return {};
    case Hook::kPostForward:
      // zero3/hybrid reshard, but not the root, which backward needs first
      // (FSDP's root does not reshard after forward); zero2 keeps the unit
      // gathered until its backward ends.
      if (traits_.reshard_after_forward && !where.root) return {Op::kReshard};
      return {};
    case Hook::kBackwardStart:
      if (sharded) return {};
      return {Op::kAllocFlatGrad};
    case Hook::kPreBackward:
      if (!sharded) return {};
      if (options_.prefetch >= 1) return {Op::kGather, Op::kPrefetchBackward, Op::kAllocGrad};
      return {Op::kGather, Op::kAllocGrad};
    case Hook::kRecompute:
      if (sharded) return {Op::kGather};
      return {};
    case Hook::kPostBackward:
      if (sharded && options_.async_reduce) return {Op::kWaitReduce, Op::kReduceScatter, Op::kReshard};
      if (sharded) return {Op::kReduceScatter, Op::kWaitReduce, Op::kReshard};
      return {};  // ddp/zero1 reduce by bucket (kGradReady), not by unit
    case Hook::kGradReady:
      // ddp/zero1 reduce only on the last micro-batch (no_sync before it).
      if (sharded || !where.last_micro_batch) return {};
      if (options_.async_reduce) return {Op::kAllReduce};
      return {Op::kAllReduce, Op::kWaitReduce};
    case Hook::kBackwardEnd:
      // ddp/zero1: buckets no gradient completed are launched now.
      if (!sharded && where.last_micro_batch) return {Op::kAllReduce, Op::kWaitReduce};
      if (sharded && options_.async_reduce) return {Op::kWaitReduce};
      return {};
  }
  return {};
}

// PyTorch's FSDP1 and FSDP2 (schedule.h): NO_SHARD is FSDP1 over the ddp
// traits, nothing sharded.
std::vector<Op> Schedule::build_torch(Hook hook, const HookContext& where) const {
  if (options_.runtime == Runtime::kTorchDdp) return build_torch_ddp(hook, where);
  const bool fsdp2 = options_.runtime == Runtime::kTorchFsdp2;
  const bool sharded = traits_.shard_params;
  switch (hook) {
    case Hook::kZeroGrad:
      return {Op::kFreeShardGrad};
    case Hook::kPreForward:
      if (options_.prefetch >= 2) return {Op::kGather, Op::kPrefetchForward};
      return {Op::kGather};
    case Hook::kPostForward:
      if (!sharded) return {Op::kReshard};  // NO_SHARD's low-precision copy
      if (traits_.reshard_after_forward && (!where.root || options_.reshard_root_after_forward))
        return {Op::kReshard};
      return {};
    case Hook::kPreBackward:
      if (options_.backward_prefetch == BackwardPrefetch::kBackwardPre) return {Op::kGather, Op::kPrefetchBackward};
      return {Op::kGather};
    case Hook::kRecompute:
      return {Op::kGather};
    case Hook::kPostBackward: {
      if (fsdp2) return {Op::kReshard, Op::kWaitReduce, Op::kReduceScatter};
      std::vector<Op> ops = {Op::kAllocGrad, Op::kReshard};
      if (options_.backward_prefetch == BackwardPrefetch::kBackwardPost) ops.push_back(Op::kPrefetchBackward);
      if (sharded) {
        ops.push_back(Op::kWaitReduce);
        ops.push_back(Op::kReduceScatter);
      } else {
        ops.push_back(Op::kAllReduce);
      }
      return ops;
    }
    case Hook::kBackwardEnd:
      return {Op::kWaitReduce};
    case Hook::kBackwardStart:
    case Hook::kGradReady:
      return {};
  }
  return {};
}

// PyTorch's DDP and ZeroRedundancyOptimizer (schedule.h): one unit, the
// model root; nothing sharded.
std::vector<Op> Schedule::build_torch_ddp(Hook hook, const HookContext& where) const {
  switch (hook) {
    case Hook::kZeroGrad:
      return {Op::kFreeShardGrad};
    case Hook::kPreForward:
      if (where.root) return {Op::kRebuildBuckets, Op::kBroadcastBuffers};
      return {};
    case Hook::kPostForward:
      if (where.root) return {Op::kCloneOutputs};
      return {};
    case Hook::kBackwardEnd:
      if (where.last_micro_batch) return {Op::kAllReduce, Op::kWaitReduce};
      return {};
    case Hook::kBackwardStart:
    case Hook::kPreBackward:
    case Hook::kRecompute:
    case Hook::kPostBackward:
    case Hook::kGradReady:
      return {};
  }
  return {};
}

}  // namespace shardfit::spec
