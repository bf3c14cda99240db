// --stack pytorch's replay (planner/pytorch_stack.h) on a hand-made trace:
// where DDP's buckets, the gradients AccumulateGrad keeps and the optimizer's
// state sit in the step, phase by phase.
#include "planner/pytorch_stack.h"

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

TEST(PytorchDdp, ATraceFileWithoutPytorchsStepIsRefused) {
  Fixture f;
  f.in.no_grads = nullptr;
  EXPECT_THROW(simulate_pytorch_ddp(f.in, {}), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::planner
