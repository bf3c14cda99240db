// The schedule as FSDP and DDP users know their step: which collectives and
// buffers each hook of a unit brings, per strategy. The simulator and the
// engine both replay these lists (the accuracy matrix checks they agree to
// the byte); here the lists themselves.
#include "spec/schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardfit::spec {
namespace {

// The actions of `hook` as a line of their names.
std::string names(const Schedule& s, Hook hook, const HookContext& where) {
  std::string out;
  for (Op op : s.actions(hook, where)) out += std::string(out.empty() ? "" : " ") + op_name(op);
  return out;
}

std::string ops(const std::string& id, Hook hook, bool root = false, bool last_micro = true,
                int prefetch = 1, bool async_reduce = false) {
  const Candidate c = parse_candidate(id);
  const Schedule s(decode_strategy(c, 4, shard_group_for(c.sharding, 4, 2)), ScheduleOptions{prefetch, async_reduce});
  return names(s, hook, {root, last_micro});
}

TEST(Schedule, DdpAllReducesOnTheLastMicroBatchOnly) {
  for (const char* id : {"ddp/fp32/wrap=block", "zero1/bf16/wrap=block", "zero1+offload/fp32/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(ops(id, Hook::kPreForward), "");
    EXPECT_EQ(ops(id, Hook::kPostForward), "");
    EXPECT_EQ(ops(id, Hook::kBackwardStart), "alloc-flat-grad");
    EXPECT_EQ(ops(id, Hook::kPreBackward), "");
    EXPECT_EQ(ops(id, Hook::kPostBackward), "") << "by bucket, not by unit";
    EXPECT_EQ(ops(id, Hook::kGradReady), "all-reduce wait-reduce");
    EXPECT_EQ(ops(id, Hook::kGradReady, false, /*last_micro=*/false), "") << "no_sync";
    EXPECT_EQ(ops(id, Hook::kBackwardEnd), "all-reduce wait-reduce") << "buckets no gradient completed";
    EXPECT_EQ(ops(id, Hook::kBackwardEnd, false, false), "");
    EXPECT_EQ(ops(id, Hook::kZeroGrad), "zero-flat-grad");
  }
}

TEST(Schedule, Zero2GathersOnceAndKeepsTheUnitThroughBackward) {
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kPreForward), "gather");
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kPostForward), "");
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kPreBackward), "gather prefetch-backward alloc-grad");
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kPostBackward), "reduce-scatter wait-reduce reshard");
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kPostBackward, false, false), "reduce-scatter wait-reduce reshard")
      << "shard grads are reduced every micro-batch";
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kZeroGrad), "free-shard-grad");
  EXPECT_EQ(ops("zero2/fp32/wrap=block", Hook::kBackwardStart), "");
}

TEST(Schedule, Zero3AndHybridReshardAfterForwardButNotTheRoot) {
  for (const char* id : {"zero3/bf16/wrap=block", "hybrid+offload/fp32/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(ops(id, Hook::kPostForward), "reshard");
    EXPECT_EQ(ops(id, Hook::kPostForward, /*root=*/true), "");
    EXPECT_EQ(ops(id, Hook::kRecompute), "gather");
    EXPECT_EQ(ops(id, Hook::kPreBackward, false, true, /*prefetch=*/0), "gather alloc-grad");
    EXPECT_EQ(ops(id, Hook::kPreForward), "gather") << "--prefetch 1: no forward prefetch";
    EXPECT_EQ(ops(id, Hook::kPreForward, false, true, 2), "gather prefetch-forward");
    EXPECT_EQ(ops(id, Hook::kPreBackward, false, true, 2), "gather prefetch-backward alloc-grad");
  }
  EXPECT_EQ(ops("ddp/fp32/wrap=block", Hook::kPreForward, false, true, 2), "") << "nothing to gather";
}

// --async-reduce: FSDP2 waits for the previous unit's reduce-scatter before
// it issues the next, so one is in flight beside backward's compute; DDP's
// all-reduces all run on and are waited for once backward is over.
TEST(Schedule, AsyncReduceWaitsForThePreviousReductionOrAtBackwardsEnd) {
  for (const char* id : {"zero2/fp32/wrap=block", "zero3+offload/bf16/wrap=block", "hybrid/fp32/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(ops(id, Hook::kPostBackward, false, true, 1, true), "wait-reduce reduce-scatter reshard");
    EXPECT_EQ(ops(id, Hook::kPostBackward, false, false, 1, true), "wait-reduce reduce-scatter reshard");
    EXPECT_EQ(ops(id, Hook::kBackwardEnd, false, true, 1, true), "wait-reduce");
    EXPECT_EQ(ops(id, Hook::kBackwardEnd), "") << "synchronous: nothing is left in flight";
  }
  for (const char* id : {"ddp/bf16/wrap=block", "zero1+offload/fp32/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(ops(id, Hook::kGradReady, false, true, 1, true), "all-reduce");
    EXPECT_EQ(ops(id, Hook::kGradReady, false, false, 1, true), "") << "no_sync";
    EXPECT_EQ(ops(id, Hook::kBackwardEnd, false, true, 1, true), "all-reduce wait-reduce");
  }
  EXPECT_EQ(ops("zero3/fp32/wrap=block", Hook::kPreBackward, false, true, 1, true),
            "gather prefetch-backward alloc-grad")
      << "gathers are what they were";
}

// PyTorch's fully_shard (torch 2.11) as the planner simulates it: the same
// actions, its post-backward resharding before it reduces, one
// reduce-scatter always in flight, no gradient of FSDP's own, and the root
// resharded after forward when its fully_shard call says so.
std::string torch_ops(const std::string& id, Hook hook, bool root = false, int prefetch = 1,
                      bool reshard_root = false, Runtime runtime = Runtime::kTorchFsdp2,
                      BackwardPrefetch backward = BackwardPrefetch::kBackwardPre) {
  const Candidate c = parse_candidate(id);
  ScheduleOptions o;
  o.prefetch = prefetch;
  o.runtime = runtime;
  o.reshard_root_after_forward = reshard_root;
  o.backward_prefetch = backward;
  check_schedule_options(o);
  return names(Schedule(decode_strategy(c, 2, 2), o), hook, {root, true});
}

TEST(Schedule, TorchFsdp2ReshardsBeforeItReducesAndLeavesGradientsToAutograd) {
  for (const char* id : {"zero2/fp32/wrap=block", "zero3/bf16/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(torch_ops(id, Hook::kPostBackward), "reshard wait-reduce reduce-scatter");
    EXPECT_EQ(torch_ops(id, Hook::kBackwardEnd), "wait-reduce") << "the last reduce-scatter's input";
    EXPECT_EQ(torch_ops(id, Hook::kPreBackward), "gather prefetch-backward") << "autograd makes the gradients";
    EXPECT_EQ(torch_ops(id, Hook::kPreForward), "gather");
    EXPECT_EQ(torch_ops(id, Hook::kPreForward, false, 2), "gather prefetch-forward");
    EXPECT_EQ(torch_ops(id, Hook::kZeroGrad), "free-shard-grad");
  }
  EXPECT_EQ(torch_ops("zero2/fp32/wrap=block", Hook::kPostForward), "");
  EXPECT_EQ(torch_ops("zero3/fp32/wrap=block", Hook::kPostForward), "reshard");
  EXPECT_EQ(torch_ops("zero3/fp32/wrap=block", Hook::kPostForward, /*root=*/true), "");
  EXPECT_EQ(torch_ops("zero3/fp32/wrap=block", Hook::kPostForward, true, 1, /*reshard_root=*/true), "reshard");
  EXPECT_EQ(torch_ops("zero2/fp32/wrap=block", Hook::kPostForward, true, 1, true), "") << "zero2 keeps every unit";
  // The engine's root keeps its parameters for backward, which needs them first.
  ScheduleOptions engine;
  engine.reshard_root_after_forward = true;
  EXPECT_THROW(check_schedule_options(engine), std::invalid_argument);
}

// FullyShardedDataParallel (FSDP1): the flat gradient made from the
// parameters' in its post-backward, BackwardPrefetch moving the backward
// prefetch there or dropping it, NO_SHARD (the ddp traits) all-reducing
// each unit's gradient and dropping its low-precision copy after every
// forward, the root's included.
TEST(Schedule, TorchFsdp1MakesTheFlatGradientThenReshardsThenReduces) {
  const auto fsdp1 = [](const std::string& id, Hook hook, bool root = false,
                        BackwardPrefetch backward = BackwardPrefetch::kBackwardPre, int prefetch = 1) {
    return torch_ops(id, hook, root, prefetch, false, Runtime::kTorchFsdp1, backward);
  };
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPostBackward), "alloc-grad reshard wait-reduce reduce-scatter");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPostBackward, false, BackwardPrefetch::kBackwardPost),
            "alloc-grad reshard prefetch-backward wait-reduce reduce-scatter");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPreBackward), "gather prefetch-backward");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPreBackward, false, BackwardPrefetch::kBackwardPost), "gather");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPreBackward, false, BackwardPrefetch::kNone), "gather");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPreForward, false, BackwardPrefetch::kBackwardPre, 2),
            "gather prefetch-forward");
  EXPECT_EQ(fsdp1("zero3/fp32/wrap=block", Hook::kPostForward, /*root=*/true), "") << "FULL_SHARD keeps the root";
  EXPECT_EQ(fsdp1("zero2/fp32/wrap=block", Hook::kPostForward), "") << "SHARD_GRAD_OP";
  for (bool root : {false, true}) {
    SCOPED_TRACE(root);
    EXPECT_EQ(fsdp1("ddp/bf16/wrap=block", Hook::kPostForward, root), "reshard") << "NO_SHARD";
    EXPECT_EQ(fsdp1("ddp/bf16/wrap=block", Hook::kPostBackward, root), "alloc-grad reshard all-reduce");
  }
  for (const char* id : {"ddp/fp32/wrap=block", "zero3/fp32/wrap=block"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(fsdp1(id, Hook::kZeroGrad), "free-shard-grad");
    EXPECT_EQ(fsdp1(id, Hook::kBackwardStart), "") << "no flat grad of its own";
    EXPECT_EQ(fsdp1(id, Hook::kGradReady), "") << "no DDP bucket";
    EXPECT_EQ(fsdp1(id, Hook::kBackwardEnd), "wait-reduce");
  }
  // Only FSDP1 moves or drops the backward prefetch.
  for (Runtime r : {Runtime::kEngine, Runtime::kTorchFsdp2}) {
    ScheduleOptions o;
    o.runtime = r;
    o.backward_prefetch = BackwardPrefetch::kBackwardPost;
    EXPECT_THROW(check_schedule_options(o), std::invalid_argument);
  }
}

// DistributedDataParallel (and ZeroRedundancyOptimizer, DDP with its own
// optimizer step): the root's forward hooks rebuild the buckets, broadcast
// the buffers and clone the outputs (each when DDP's state says so), and
// only the micro-batch outside no_sync reduces, as its backward ends.
TEST(Schedule, TorchDdpActsAtTheRootAndReducesOnlyOutsideNoSync) {
  for (const char* id : {"ddp/fp32/wrap=none", "zero1/fp32/wrap=none"}) {
    SCOPED_TRACE(id);
    ScheduleOptions o;
    o.runtime = Runtime::kTorchDdp;
    check_schedule_options(o);
    const Schedule s(decode_strategy(parse_candidate(id), 2, 2), o);
    EXPECT_EQ(names(s, Hook::kZeroGrad, {true, true}), "free-shard-grad");
    EXPECT_EQ(names(s, Hook::kPreForward, {true, true}), "rebuild-buckets broadcast-buffers");
    EXPECT_EQ(names(s, Hook::kPreForward, {true, false}), "rebuild-buckets broadcast-buffers")
        << "a no_sync forward still checks whether the one before it synced";
    EXPECT_EQ(names(s, Hook::kPostForward, {true, true}), "clone-outputs");
    EXPECT_EQ(names(s, Hook::kBackwardEnd, {true, true}), "all-reduce wait-reduce");
    EXPECT_EQ(names(s, Hook::kBackwardEnd, {true, false}), "") << "no_sync";
    for (Hook h : {Hook::kBackwardStart, Hook::kPreBackward, Hook::kRecompute, Hook::kPostBackward, Hook::kGradReady})
      EXPECT_EQ(names(s, h, {true, true}), "") << "the reducer's per-bucket work allocates nothing";
    EXPECT_EQ(names(s, Hook::kPreForward, {false, true}), "") << "DDP has one unit, the root";
  }
  // Only FSDP2 reshards the root after forward, only FSDP1 moves the prefetch.
  ScheduleOptions root;
  root.runtime = Runtime::kTorchDdp;
  root.reshard_root_after_forward = true;
  EXPECT_THROW(check_schedule_options(root), std::invalid_argument);
}

TEST(Schedule, PrefetchPositionsGoForwardOneShortAndBackwardFullDepth) {
  const Schedule s(decode_strategy(parse_candidate("zero3/fp32/wrap=block"), 2, 2), ScheduleOptions{2});
  // Five units ran forward; the one at position 2.
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchForward, 2, 1, 5), 3);
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchForward, 2, 2, 5), -1) << "N - 1 = 1 deep";
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchBackward, 2, 1, 5), 1);
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchBackward, 2, 2, 5), 0);
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchBackward, 2, 3, 5), -1) << "N = 2 deep";
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchForward, 4, 1, 5), -1) << "the last unit has none after it";
  EXPECT_EQ(s.prefetch_position(Op::kPrefetchBackward, 0, 1, 5), -1) << "the first has none before it";
}

}  // namespace
}  // namespace shardfit::spec
