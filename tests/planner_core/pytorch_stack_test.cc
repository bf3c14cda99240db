// --stack pytorch's replay (planner/pytorch_stack.h) on a hand-made trace:
// where DDP's buckets, the gradients AccumulateGrad keeps and the optimizer's
// state sit in the step, phase by phase.
#include "planner/pytorch_stack.h"

#include "planner/pytorch_fsdp.h"

#include <gtest/gtest.h>

namespace shardfit::planner {
namespace {

MemEvent ev(MemEvent::Kind k, Phase ph, int64_t tensor, int64_t bytes = 0) {
  MemEvent e;
  e.kind = k;
  e.phase = ph;
  e.tensor = tensor;
  e.bytes = bytes;
  return e;
}

// A 100-byte model: forward makes 1000 bytes of activations, backward a
// 300-byte temporary and a 100-byte gradient that AccumulateGrad keeps
// (no-grads trace) or adds and frees (with-grads trace).
ModelTrace step_trace(bool grads_at_start) {
  ModelTrace t;
  t.grads_at_start = grads_at_start;
  t.events = {ev(MemEvent::kAlloc, Phase::kForward, 1, 1000), ev(MemEvent::kAlloc, Phase::kBackward, 2, 300),
              ev(MemEvent::kAlloc, Phase::kBackward, 3, 100), ev(MemEvent::kFree, Phase::kBackward, 2),
              ev(MemEvent::kFree, Phase::kBackward, 1)};
  if (grads_at_start) t.events.push_back(ev(MemEvent::kFree, Phase::kBackward, 3));
  return t;
}

// AdamW: step 1 makes 200 bytes of state and a 50-byte temporary; later steps only the temporary.
ModelTrace optimizer_trace(bool first) {
  ModelTrace t;
  if (first) t.events = {ev(MemEvent::kAlloc, Phase::kForward, 1, 200)};
  t.events.push_back(ev(MemEvent::kAlloc, Phase::kForward, 2, 50));
  t.events.push_back(ev(MemEvent::kFree, Phase::kForward, 2));
  return t;
}

struct Fixture {
  ModelTrace none = step_trace(false), with = step_trace(true);
  ModelTrace opt1 = optimizer_trace(true), opt2 = optimizer_trace(false);
  PytorchDdpInputs in = inputs();
  PytorchDdpInputs inputs() {
    PytorchDdpInputs i;
    i.no_grads = &none;
    i.with_grads = &with;
    i.optimizer_first = &opt1;
    i.optimizer_later = &opt2;
    i.param_bytes = 100;
    return i;
  }
};

TEST(PytorchDdp, DefaultModeKeepsGradientsBesideTheBuckets) {
  Fixture f;
  const StepSimResult r = simulate_pytorch_ddp(f.in, {});
  ASSERT_FALSE(r.oom);
  // init: parameters + buckets. step 1: +1000 +300 +100 (grad kept) at the peak.
  ASSERT_EQ(r.timeline.size(), 7u);
  EXPECT_EQ(r.timeline[0].label, "init");
  EXPECT_EQ(r.timeline[0].allocated_bytes, 200);
  EXPECT_EQ(r.timeline[1].label, "step1/forward");
  EXPECT_EQ(r.timeline[1].allocated_bytes, 1200);
  EXPECT_EQ(r.timeline[2].label, "step1/backward");
  EXPECT_EQ(r.timeline[2].peak_allocated_bytes, 1600);
  EXPECT_EQ(r.timeline[2].allocated_bytes, 300);  // the gradient stays
  EXPECT_EQ(r.timeline[3].allocated_bytes, 500);  // + AdamW's state
  EXPECT_EQ(r.timeline[3].peak_allocated_bytes, 550);
  // step 2: zero_grad(set_to_none=True) frees the gradient first.
  EXPECT_EQ(r.timeline[4].allocated_bytes, 400 + 1000);
  EXPECT_EQ(r.timeline[5].peak_allocated_bytes, 1800);
  EXPECT_EQ(r.peak_allocated_bytes, 1800);
  EXPECT_EQ(r.peak_allocated_label, "step2/backward");
  EXPECT_EQ(r.peak_breakdown_bytes[static_cast<int>(Category::kOptimizer)], 200);
  EXPECT_EQ(r.peak_breakdown_bytes[static_cast<int>(Category::kCommBuffers)], 100);
}

TEST(PytorchDdp, BucketViewGradientsLiveInTheBuckets) {
  Fixture f;
  PytorchDdpOptions o;
  o.gradient_as_bucket_view = true;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  EXPECT_EQ(r.timeline[2].allocated_bytes, 200);  // no gradient outside the buckets
  EXPECT_EQ(r.peak_allocated_bytes, 400 + 1400);
}

TEST(PytorchDdp, AnAllocationPastTheBudgetIsOutOfMemoryWhereItHappens) {
  Fixture f;
  PytorchDdpOptions o;
  o.budget_bytes = 1700;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  EXPECT_TRUE(r.oom);
  EXPECT_EQ(r.oom_label, "step2/backward");
  EXPECT_EQ(r.oom_category, Category::kGrads);  // the gradient AccumulateGrad keeps, past 1700
  o.budget_bytes = 1800;
  EXPECT_FALSE(simulate_pytorch_ddp(f.in, o).oom);
}

// broadcast_coalesced's flat tensors (c10d comm.cpp): one bucket per dtype,
// closed once it reaches the limit, in the order of its first tensor; a
// bucket of one tensor is a view of it.
TEST(PytorchDdp, BroadcastCoalescedFlattensEachDtypesBucket) {
  EXPECT_EQ(broadcast_coalesced_flats({{"float32", 100}, {"float32", 50}, {"uint8", 30}, {"uint8", 30}}, 1000),
            (std::vector<int64_t>{150, 60}));
  EXPECT_EQ(broadcast_coalesced_flats({{"uint8", 30}, {"float32", 4}, {"uint8", 30}}, 1000),
            (std::vector<int64_t>{60, 0}));  // uint8's bucket starts first; float32's lone tensor: a view
  EXPECT_EQ(broadcast_coalesced_flats({{"float32", 600}, {"float32", 600}, {"float32", 10}}, 1000),
            (std::vector<int64_t>{1200, 0}));
}

// A model with buffers: they are allocated with it, and DDP broadcasts them
// (with the parameters at construction, alone before every forward).
TEST(PytorchDdp, BuffersAreBroadcastAtInitAndBeforeEveryForward) {
  Fixture f;
  f.in.param_numels = {25};  // the 100-byte model: one parameter
  f.in.buffers = {{"a", {30}, "uint8", 30}, {"b", {30}, "uint8", 30}, {"c", {}, "float32", 4}};
  ModelTrace small;  // the input, then the model: 10 bytes of activations, a kept 100-byte gradient
  MemEvent root = ev(MemEvent::kModuleBegin, Phase::kForward, -1);
  root.module = 0;
  small.events = {ev(MemEvent::kAlloc, Phase::kForward, 1, 8), root, ev(MemEvent::kAlloc, Phase::kForward, 2, 10),
                  ev(MemEvent::kAlloc, Phase::kBackward, 3, 100), ev(MemEvent::kFree, Phase::kBackward, 2),
                  ev(MemEvent::kFree, Phase::kBackward, 1)};
  f.in.no_grads = &small;
  const StepSimResult r = simulate_pytorch_ddp(f.in, {});
  // init: parameters 100 + buffers 64, the flats (parameter + c: 104; a + b: 60), then the buckets (100)
  EXPECT_EQ(r.timeline[0].peak_allocated_bytes, 100 + 64 + 104 + 60);
  EXPECT_EQ(r.timeline[0].allocated_bytes, 100 + 64 + 100);
  // step 1's forward: the input, then the buffers' flat (a + b; c alone is a view), then 10 bytes
  EXPECT_EQ(r.timeline[1].peak_allocated_bytes, 264 + 8 + 60);
}

// --grad-accum 2 on the model with buffers: a forward broadcasts them only
// when the one before it synced (DDP's require_forward_param_sync), so the
// no_sync micro-batch's forward does and the synced one's does not; step
// 2's first forward rebuilds the buckets (the first synced backward has
// recorded the gradients' order) before it broadcasts.
TEST(PytorchDdp, OnlyAForwardAfterASyncedOneBroadcastsTheBuffers) {
  Fixture f;
  f.in.param_numels = {25};
  f.in.buffers = {{"a", {30}, "uint8", 30}, {"b", {30}, "uint8", 30}, {"c", {}, "float32", 4}};
  MemEvent root = ev(MemEvent::kModuleBegin, Phase::kForward, -1);
  root.module = 0;
  ModelTrace none, with;  // the input, the model's 10 bytes of activations, its 100-byte gradient
  none.events = {ev(MemEvent::kAlloc, Phase::kForward, 1, 8), root, ev(MemEvent::kAlloc, Phase::kForward, 2, 10),
                 ev(MemEvent::kAlloc, Phase::kBackward, 3, 100), ev(MemEvent::kFree, Phase::kBackward, 2),
                 ev(MemEvent::kFree, Phase::kBackward, 1)};
  with = none;
  with.grads_at_start = true;
  with.events.push_back(ev(MemEvent::kFree, Phase::kBackward, 3));
  f.in.no_grads = &none;
  f.in.with_grads = &with;
  PytorchDdpOptions o;
  o.grad_accum = 2;
  o.zero_grad_set_to_none = false;  // the gradient stays: step 2 starts at step 1's end
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  ASSERT_FALSE(r.oom);
  ASSERT_EQ(r.timeline[1].label, "step1.1/forward");
  EXPECT_EQ(r.timeline[1].peak_allocated_bytes, 264 + 8 + 60);  // init's 264, the input, a + b's flat
  ASSERT_EQ(r.timeline[3].label, "step1.2/forward");
  EXPECT_EQ(r.timeline[3].peak_allocated_bytes, 364 + 8 + 10);  // the kept gradient; no broadcast
  ASSERT_EQ(r.timeline[5].label, "step1/optimizer");
  EXPECT_EQ(r.timeline[5].allocated_bytes, 364 + 200);  // AdamW's state
  ASSERT_EQ(r.timeline[6].label, "step2.1/forward");
  // The rebuild's 24 bytes of indices come and go under the broadcast's 60.
  EXPECT_EQ(r.timeline[6].peak_allocated_bytes, 564 + 8 + 60);
  EXPECT_EQ(r.timeline[6].allocated_bytes, 564 + 8 + 10);
}

// DDP's schedule: its sharding is DDP's, or ZeroRedundancyOptimizer's
// optimizer state; anything sharding parameters or gradients is FSDP's.
TEST(PytorchDdp, ItsScheduleShardsNothingButTheOptimizerState) {
  spec::ScheduleOptions o;
  o.runtime = spec::Runtime::kTorchDdp;
  EXPECT_EQ(spec::op_name(pytorch_schedule(spec::Sharding::kZero1, o).actions(spec::Hook::kPreForward, {true, true})
                              .at(0)),
            std::string("rebuild-buckets"));
  for (spec::Sharding s : {spec::Sharding::kZero2, spec::Sharding::kZero3, spec::Sharding::kHybrid})
    EXPECT_THROW(pytorch_schedule(s, o), std::invalid_argument) << spec::sharding_name(s);
}

// A one-process job Accelerate leaves unwrapped (PytorchDdpOptions::wrapped
// false): the same model and loop without DDP's buckets and broadcasts.
TEST(PytorchDdp, AnUnwrappedModelHasNoBucketsAndNoBroadcasts) {
  Fixture f;
  f.in.param_numels = {25};
  f.in.buffers = {{"a", {30}, "uint8", 30}, {"b", {30}, "uint8", 30}};
  PytorchDdpOptions o;
  o.wrapped = false;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(r.timeline[0].peak_allocated_bytes, 100 + 60);  // parameters and buffers: no flats, no buckets
  EXPECT_EQ(r.timeline[1].peak_allocated_bytes, 160 + 1000);  // step 1's forward: no buffer broadcast
  EXPECT_EQ(r.peak_allocated_bytes, 1800 - 100 + 60);  // the wrapped peak (DefaultMode...) less its buckets
  EXPECT_EQ(r.peak_breakdown_bytes[static_cast<int>(Category::kCommBuffers)], 0);
  // DDP's options, or more than one GPU, need the wrapper.
  for (auto set : {+[](PytorchDdpOptions& x) { x.world_size = 2; },
                   +[](PytorchDdpOptions& x) { x.static_graph = true; },
                   +[](PytorchDdpOptions& x) { x.gradient_as_bucket_view = true; },
                   +[](PytorchDdpOptions& x) { x.zero_redundancy = true; }}) {
    PytorchDdpOptions bad = o;
    set(bad);
    EXPECT_THROW(simulate_pytorch_ddp(f.in, bad), std::invalid_argument);
  }
}

// Reducer::sync_bucket_indices when the buckets are rebuilt (step 2): two
// int32 tensors of parameters + 1 and two of buckets. gpt2-tiny (28
// parameters, one bucket): 240 bytes, as measured around
// reducer._rebuild_buckets() on 2 Gloo ranks (also bert-tiny's 42: 352;
// llama-tiny's 21: 184).
TEST(PytorchDdp, RebuildingTheBucketsSyncsTheirIndices) {
  EXPECT_EQ(ddp_rebuild_sync_bytes(std::vector<int64_t>(28, 100)), 240);
  EXPECT_EQ(ddp_rebuild_sync_bytes(std::vector<int64_t>(42, 100)), 352);
  EXPECT_EQ(ddp_rebuild_sync_bytes(std::vector<int64_t>(21, 100)), 184);
  // 1.2 MB each: the first bucket (1 MiB cap) closes after one, the second holds the other
  EXPECT_EQ(ddp_rebuild_sync_bytes({300000, 300000}), 2 * 4 * 3 + 2 * 4 * 2);
}

// DDP(bucket_cap_mb=...): after the 1 MiB first bucket, each rebuilt bucket
// closes once it holds at least the cap, in gradient-ready order (the
// reverse of parameters()). Five 400 kB parameters: first bucket 1.2 MB
// (three), then at 25 MiB one of 0.8 MB, at 0.5 MiB the same (the fourth's
// 400 kB is under it, the fifth's takes it over), at 0.25 MiB one each.
TEST(PytorchDdp, TheBucketCapSizesTheRebuiltBuckets) {
  const std::vector<int64_t> numels(5, 100000);
  EXPECT_EQ(ddp_bucket_bytes(numels), (std::vector<int64_t>{1200000, 800000}));
  EXPECT_EQ(ddp_bucket_bytes(numels, int64_t{1} << 19), (std::vector<int64_t>{1200000, 800000}));
  EXPECT_EQ(ddp_bucket_bytes(numels, int64_t{1} << 18), (std::vector<int64_t>{1200000, 400000, 400000}));
  EXPECT_EQ(ddp_rebuild_sync_bytes(numels, int64_t{1} << 18), 2 * 4 * 6 + 2 * 4 * 3);
}

// On a CUDA profile the same step runs through the caching allocator's
// model: every storage a block of at least 512 bytes (the 100-byte
// parameter, its bucket, ...), segments reserved from the device.
TEST(PytorchDdp, OnCudaTheCachingAllocatorDecides) {
  Fixture f;
  PytorchDdpOptions o;
  o.cuda_caching = true;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  EXPECT_EQ(r.timeline[0].allocated_bytes, 512 + 512);  // the parameter and its bucket, 512 B blocks
  EXPECT_EQ(r.timeline[0].reserved_bytes, 2 << 20);     // one small-pool segment
  EXPECT_GT(r.peak_allocated_bytes, simulate_pytorch_ddp(f.in, {}).peak_allocated_bytes);
}

// zero_grad(set_to_none=False), PyTorch 1.x's default: the gradients stay
// from step 1's backward on, and step 2 accumulates into them.
TEST(PytorchDdp, ZeroGradInPlaceKeepsTheGradients) {
  Fixture f;
  PytorchDdpOptions o;
  o.zero_grad_set_to_none = false;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  // step 2's forward starts with the gradient (100) beside params, bucket and state (200)
  EXPECT_EQ(r.timeline[4].peak_allocated_bytes, 100 + 100 + 100 + 200 + 1000);
  EXPECT_EQ(simulate_pytorch_ddp(f.in, {}).timeline[4].peak_allocated_bytes, 100 + 100 + 200 + 1000);
}

// torch.cuda.amp.GradScaler (grad_scaler.py, 1.13): its scale and growth
// tracker (4 B each) made as the first scale() runs, after step 1's forward;
// unscale_'s float64 scale, its reciprocal, the float32 inverse, found_inf
// and both their device copies around the optimizer step, the found_inf copy
// kept until update().
TEST(PytorchDdp, GradScalerKeepsItsScaleAndUnscalesAroundTheStep) {
  Fixture f;
  PytorchDdpOptions o;
  o.grad_scaler = true;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  const StepSimResult plain = simulate_pytorch_ddp(f.in, {});
  ASSERT_FALSE(r.oom);
  ASSERT_EQ(r.timeline.size(), plain.timeline.size());
  EXPECT_EQ(r.timeline[0].allocated_bytes, plain.timeline[0].allocated_bytes);  // nothing at init
  // scaler.scale(loss) runs after the forward returned (the point
  // step1/forward): its scale and growth tracker come in step 1's backward.
  EXPECT_EQ(r.timeline[1].allocated_bytes, plain.timeline[1].allocated_bytes);
  EXPECT_EQ(r.timeline[2].allocated_bytes, 300 + 8);
  // Before AdamW: 308 -> +8 +8 -8 +4 -8 +4 +4 +4 (324 at most) -> 312; AdamW's
  // 200 + 50 on top: 562; then its temporary and the found_inf copy go: 508.
  EXPECT_EQ(r.timeline[3].peak_allocated_bytes, 562);
  EXPECT_EQ(r.timeline[3].allocated_bytes, 508);
  EXPECT_EQ(r.peak_allocated_bytes, plain.peak_allocated_bytes + 8);
  // On CUDA every one is a 512-byte block of the small pool.
  o.cuda_caching = true;
  const StepSimResult c = simulate_pytorch_ddp(f.in, o);
  PytorchDdpOptions co;
  co.cuda_caching = true;
  EXPECT_EQ(c.timeline[2].allocated_bytes, simulate_pytorch_ddp(f.in, co).timeline[2].allocated_bytes + 2 * 512);
}

// --grad-accum 2: the first micro-batch under no_sync() keeps its gradient
// as .grad (no-grads trace), the second accumulates into it (with-grads
// trace) and reduces; one optimizer step after both.
TEST(PytorchDdp, GradientAccumulationKeepsTheFirstMicroBatchsGradients) {
  Fixture f;
  PytorchDdpOptions o;
  o.grad_accum = 2;
  o.steps = 1;
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  ASSERT_FALSE(r.oom);
  ASSERT_EQ(r.timeline.size(), 6u);
  EXPECT_EQ(r.timeline[1].label, "step1.1/forward");
  EXPECT_EQ(r.timeline[2].label, "step1.1/backward");
  EXPECT_EQ(r.timeline[2].allocated_bytes, 300);       // parameter, bucket, the kept gradient
  EXPECT_EQ(r.timeline[3].label, "step1.2/forward");
  EXPECT_EQ(r.timeline[3].allocated_bytes, 1300);
  EXPECT_EQ(r.timeline[4].label, "step1.2/backward");
  EXPECT_EQ(r.timeline[4].peak_allocated_bytes, 1700);  // + the op's gradient before it is added in
  EXPECT_EQ(r.timeline[4].allocated_bytes, 300);
  EXPECT_EQ(r.timeline[5].label, "step1/optimizer");
  EXPECT_EQ(r.timeline[5].allocated_bytes, 500);
  o.gradient_as_bucket_view = true;  // no_sync's own .grad tensors: not modelled
  EXPECT_THROW(simulate_pytorch_ddp(f.in, o), std::invalid_argument);
}

// DDP(static_graph=True): two int32 maps of the parameters at init; in the
// first iteration _DDPSink clones what the forward returns (here a 40-byte
// storage whose returned tensor is 30 bytes) and the original goes; with
// bucket views the gradients stay .grad until the delayed all-reduce at the
// backward's end.
TEST(PytorchDdp, StaticGraphClonesTheFirstOutputsAndDelaysTheReduce) {
  Fixture f;
  for (ModelTrace* t : {&f.none, &f.with}) {
    t->events.insert(t->events.begin() + 1, ev(MemEvent::kAlloc, Phase::kForward, 4, 40));
    t->kept_outputs = {4};
    t->output_tensor_bytes = {30};
  }
  PytorchDdpOptions plain_o, o;
  plain_o.steps = o.steps = 3;
  o.static_graph = true;
  const StepSimResult plain = simulate_pytorch_ddp(f.in, plain_o);
  const StepSimResult r = simulate_pytorch_ddp(f.in, o);
  ASSERT_FALSE(r.oom);
  ASSERT_EQ(r.timeline.size(), 10u);
  EXPECT_EQ(r.timeline[0].allocated_bytes, plain.timeline[0].allocated_bytes + 8);  // local_used_map(_dev)
  EXPECT_EQ(r.timeline[1].peak_allocated_bytes, plain.timeline[1].allocated_bytes + 8 + 30);  // clone beside original
  EXPECT_EQ(r.timeline[1].allocated_bytes, plain.timeline[1].allocated_bytes + 8 - 10);       // then the original goes
  EXPECT_EQ(r.timeline[7].allocated_bytes, plain.timeline[7].allocated_bytes + 8);  // step 3: steady again
  EXPECT_EQ(r.timeline[8].peak_allocated_bytes, plain.timeline[8].peak_allocated_bytes + 8);
  // Bucket views: step 1's gradients (100) held to the backward's end, then views.
  o.gradient_as_bucket_view = true;
  const StepSimResult bv = simulate_pytorch_ddp(f.in, o);
  EXPECT_EQ(bv.timeline[2].peak_allocated_bytes, r.timeline[2].peak_allocated_bytes);
  EXPECT_EQ(bv.timeline[2].allocated_bytes, r.timeline[2].allocated_bytes - 100);
  // A trace that does not list the returned tensors cannot say what is cloned.
  f.none.output_tensor_bytes.clear();
  EXPECT_THROW(simulate_pytorch_ddp(f.in, o), std::invalid_argument);
}

TEST(PytorchDdp, ATraceFileWithoutPytorchsStepIsRefused) {
  Fixture f;
  f.in.no_grads = nullptr;
  EXPECT_THROW(simulate_pytorch_ddp(f.in, {}), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::planner
