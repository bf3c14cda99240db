// FlatParam in one process (loopback communicator): the bytes each
// transition allocates and frees, storage freed under live autograd views and
// refilled in the same StorageImpl, padding, and AdamW on shards.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "executor/comm.h"
#include "executor/flat_param.h"
#include "executor/meter.h"
#include "models/autograd_hooks.h"

namespace shardfit::executor {
namespace {

std::unique_ptr<Communicator> loopback(int rank, int world) {
  CommOptions o;
  o.backend = Backend::kLoopback;
  o.rank = rank;
  o.world_size = world;
  return make_communicator(o);
}

// Two parameters, 6 + 4 = 10 elements: over 3 ranks each holds 4 (12
// padded), rank 2 holding elements 8..9 and two of padding.
struct TwoParams {
  std::vector<torch::Tensor> params;
  std::vector<spec::ParamInfo> infos = {{"a.weight", {2, 3}, 6}, {"a.bias", {4}, 4}};
  TwoParams() {
    ScopedUntracked host;
    params.push_back(torch::arange(6, torch::kFloat).view({2, 3}).requires_grad_(true));
    params.push_back((torch::arange(4, torch::kFloat) + 6).requires_grad_(true));
  }
};

FlatParamConfig sharded_fp32() {
  FlatParamConfig c;
  c.sharded_params = true;
  return c;
}

TEST(FlatParam, ShardHoldsThisRanksSliceWithZeroPadding) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  TwoParams p;
  const int64_t before = meter.allocated_bytes();
  FlatParam f("a", spec::FlatParamLayout(p.infos, 3), /*rank=*/2, sharded_fp32(), p.params);
  EXPECT_EQ(meter.allocated_bytes() - before, 4 * 4);  // init: the fp32 shard only
  EXPECT_EQ(f.state(), ParamState::kSharded);
  EXPECT_TRUE(torch::equal(f.master(), torch::tensor({8.0f, 9.0f, 0.0f, 0.0f})));
}

TEST(FlatParam, ReshardFreesStorageUnderLiveViewsAndUnshardRefillsIt) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  TwoParams p;
  auto comm = loopback(0, 1);
  FlatParam f("a", spec::FlatParamLayout(p.infos, 1), 0, sharded_fp32(), p.params);
  const int64_t sharded = meter.allocated_bytes();
  f.unshard(*comm);
  EXPECT_EQ(meter.allocated_bytes() - sharded, 10 * 4);  // the gathered buffer
  EXPECT_EQ(f.state(), ParamState::kUnsharded);
  torch::Tensor& w = f.params()[0];
  const c10::StorageImpl* storage = w.storage().unsafeGetStorageImpl();
  EXPECT_TRUE(torch::equal(w, torch::arange(6, torch::kFloat).view({2, 3})));

  // Forward saves w; reshard frees its memory while autograd holds it.
  torch::Tensor x = torch::ones({2, 3});
  torch::Tensor loss = (w * x).sum() + f.params()[1].sum();
  const int64_t before_reshard = meter.allocated_bytes();
  f.reshard();
  EXPECT_EQ(meter.allocated_bytes(), before_reshard - 10 * 4);
  EXPECT_EQ(w.storage().nbytes(), 0u);

  // Backward: re-gather into the same StorageImpl, gradients into views.
  f.unshard(*comm);
  EXPECT_EQ(w.storage().unsafeGetStorageImpl(), storage);
  f.alloc_unsharded_grad();
  loss.backward();
  EXPECT_TRUE(torch::equal(w.grad(), torch::ones({2, 3})));
  f.reduce_grad(*comm, nullptr);
  EXPECT_FALSE(f.has_unsharded_grad());
  EXPECT_TRUE(torch::equal(f.optimizer_grad(), torch::ones({10})));
  // Resharding is the schedule's next action (spec/schedule.h), not reduce_grad's.
  EXPECT_EQ(f.state(), ParamState::kUnsharded);
  f.reshard();
  EXPECT_EQ(f.state(), ParamState::kSharded);
}

// --async-reduce's two halves: the launch allocates the reduce-scatter's
// output and keeps the unsharded grad (the collective still reads it); the
// finish frees it. The simulator charges the same bytes at the same actions.
TEST(FlatParam, ALaunchedReductionKeepsTheUnshardedGradUntilItFinishes) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  TwoParams p;
  auto comm = loopback(1, 2);  // rank 1 of 2: s = 5 elements
  FlatParam f("a", spec::FlatParamLayout(p.infos, 2), 1, sharded_fp32(), p.params);
  f.unshard(*comm);
  torch::Tensor loss = f.params()[0].sum() + f.params()[1].sum() * 3;
  f.alloc_unsharded_grad();
  loss.backward();
  const int64_t before = meter.allocated_bytes();
  f.launch_reduce_grad(*comm, nullptr);
  EXPECT_TRUE(f.reduce_in_flight());
  EXPECT_TRUE(f.has_unsharded_grad());
  EXPECT_EQ(meter.allocated_bytes() - before, 5 * 4) << "the fp32 shard grad, the reduce-scatter's output";
  EXPECT_THROW(f.launch_reduce_grad(*comm, nullptr), std::logic_error) << "one reduction per unit at a time";
  f.finish_reduce_grad();
  EXPECT_FALSE(f.reduce_in_flight());
  EXPECT_FALSE(f.has_unsharded_grad());
  EXPECT_EQ(meter.allocated_bytes() - before, 5 * 4 - 10 * 4) << "the unsharded grad freed";
  // Loopback averages 2 identical ranks: rank 1's slice is elements 5..9.
  EXPECT_TRUE(torch::equal(f.optimizer_grad(), torch::tensor({1.f, 3.f, 3.f, 3.f, 3.f})));
  f.finish_reduce_grad();  // nothing in flight: nothing to do
}

// --async-gather's halves: a prefetched gather allocates the staging cast
// and the gathered storage at launch and frees the staging copy when it is
// waited for (unshard does, as the unit's own gather).
TEST(FlatParam, APrefetchedGatherKeepsItsStagingCopyUntilWaitedFor) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  TwoParams p;
  auto comm = loopback(0, 2);  // s = 5, P = 10
  FlatParamConfig c = sharded_fp32();
  c.compute_dtype = torch::kBFloat16;
  FlatParam f("a", spec::FlatParamLayout(p.infos, 2), 0, c, p.params);
  const int64_t before = meter.allocated_bytes();
  f.launch_unshard(*comm);
  EXPECT_TRUE(f.gather_in_flight());
  EXPECT_EQ(f.state(), ParamState::kUnsharded);
  EXPECT_EQ(meter.allocated_bytes() - before, 5 * 2 + 10 * 2) << "the bf16 staging shard and the gathered buffer";
  f.unshard(*comm);  // the unit's own gather: waits, allocates nothing more
  EXPECT_FALSE(f.gather_in_flight());
  EXPECT_EQ(meter.allocated_bytes() - before, 10 * 2) << "the staging copy freed";
  f.reshard();
  EXPECT_EQ(meter.allocated_bytes(), before);
}

TEST(FlatParam, MixedPrecisionGathersThroughAStagingCast) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  TwoParams p;
  auto comm = loopback(1, 2);
  FlatParamConfig c = sharded_fp32();
  c.compute_dtype = torch::kBFloat16;
  FlatParam f("a", spec::FlatParamLayout(p.infos, 2), 1, c, p.params);
  meter.reset_peak();
  const int64_t sharded = meter.allocated_bytes();
  f.unshard(*comm);
  // staging 2*s (5 elements) + gathered 2*P (10), then the staging goes.
  EXPECT_EQ(meter.peak_allocated_bytes() - sharded, 2 * 5 + 2 * 10);
  EXPECT_EQ(meter.allocated_bytes() - sharded, 2 * 10);
  EXPECT_EQ(f.params()[0].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(f.params()[0].requires_grad());
}

TEST(FlatParam, FullParamsAreViewsOfOneFlatBufferAndGradsOfTheEnginesSlice) {
  TwoParams p;
  auto comm = loopback(0, 1);
  FlatParamConfig c;  // ddp
  FlatParam f("a", spec::FlatParamLayout(p.infos, 1), 0, c, p.params);
  EXPECT_EQ(f.params()[1].data_ptr<float>(), f.params()[0].data_ptr<float>() + 6);
  torch::Tensor flat_grad = torch::zeros({10});
  f.attach_flat_grad(flat_grad);
  (f.params()[0].sum() * 2 + f.params()[1].sum()).backward();
  EXPECT_TRUE(torch::equal(flat_grad, torch::tensor({2.f, 2.f, 2.f, 2.f, 2.f, 2.f, 1.f, 1.f, 1.f, 1.f})));
  EXPECT_THROW(f.reduce_grad(*comm, nullptr), std::logic_error) << "the engine reduces the flat grad by bucket";
  comm->all_reduce(flat_grad, ReduceOp::kAvg);
  f.grads_reduced();  // ddp: nothing to copy
  AdamWOptions o;
  o.weight_decay = 0;
  f.optimizer_step(o, 1, *comm);
  // AdamW's first step moves every element by lr against its gradient's sign.
  EXPECT_NEAR(f.params()[0][0][0].item<float>(), 0.0f - o.lr, 1e-7);
  EXPECT_EQ(f.exp_avg().numel(), 10);
}

// DDP's buckets are launched from each parameter's AccumulateGrad
// post-hook (models::after_grad_accumulated): when it runs, that gradient is
// in its slice of the flat grad, and it runs once per backward, also for a
// parameter used twice and inside a recomputed (checkpointed) function.
TEST(FlatParam, GradAccumulatedHookSeesTheGradientInTheFlatGrad) {
  TwoParams p;
  FlatParam f("a", spec::FlatParamLayout(p.infos, 1), 0, FlatParamConfig{}, p.params);
  torch::Tensor flat_grad = torch::zeros({10});
  f.attach_flat_grad(flat_grad);
  std::vector<std::vector<float>> seen(2);
  std::vector<std::shared_ptr<torch::autograd::Node>> keep;
  for (int i = 0; i < 2; ++i) {
    keep.push_back(models::after_grad_accumulated(f.params()[i], [&, i] {
      const torch::Tensor g = f.params()[i].grad().reshape({-1});
      seen[i].push_back(g.sum().item<float>());
    }));
  }
  // a used twice (2 + 1 per element), b inside a checkpointed function.
  const torch::Tensor y = models::checkpoint({f.params()[1]}, [](const std::vector<torch::Tensor>& in) {
    return in[0].sum() * 5;
  });
  (f.params()[0].sum() * 2 + f.params()[0].sum() + y).backward();
  EXPECT_EQ(seen[0], std::vector<float>{18.f}) << "once, with both uses accumulated: 6 elements x 3";
  EXPECT_EQ(seen[1], std::vector<float>{20.f}) << "4 elements x 5, from the recomputed graph";
  EXPECT_TRUE(torch::equal(flat_grad.narrow(0, 6, 4), torch::full({4}, 5.f)));
  EXPECT_THROW(models::after_grad_accumulated(flat_grad, [] {}), std::invalid_argument) << "not a leaf needing grad";
}

TEST(FlatParam, AllocationFreeHelpers) {
  TrackingAllocator& meter = TrackingAllocator::cpu();
  torch::Tensor t = torch::tensor({1.0f, -2.0f, 2.0f});
  torch::Tensor b = torch::tensor({1.0f, 1.0f, 1.0f}).to(torch::kBFloat16);
  const int64_t allocs = meter.num_allocs();
  EXPECT_DOUBLE_EQ(sum_of_squares(t), 9.0);
  EXPECT_TRUE(all_finite(t));
  multiply_in_place(t, 0.5);
  add_into_fp32(t, b);
  EXPECT_EQ(meter.num_allocs(), allocs);
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.5f, 0.0f, 2.0f})));
  t[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(t));
}

}  // namespace
}  // namespace shardfit::executor
