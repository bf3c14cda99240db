// Time model under gradient accumulation (StepTimeInputs::grad_accum), worked
// by hand on time_model_test.cc's fake device: k micro-batches run forward
// and backward k times; sharded strategies communicate (and offload copies)
// on each, ddp/zero1 all-reduce after the last only; tokens count all k.
#include <gtest/gtest.h>

#include <stdexcept>

#include "planner/time_model.h"

namespace shardfit::planner {
namespace {

// time_model_test.cc's round numbers.
DeviceProfile fake_device() {
  DeviceProfile p;
  p.name = "fake";
  p.fp32_flops_per_s = 1e12;
  p.fp16_flops_per_s = 8e12;
  p.memory_bytes_per_s = 100e9;
  p.gpu_link = {"fake link", 10e9};
  p.inter_node_link = {"fake net", 1e9};
  p.host_link = {"fake pcie", 2e9};
  p.host_memory_bytes_per_s = 10e9;
  p.efficiency = {/*flops_fp32=*/0.5, /*flops_fp16=*/0.25, /*flops_bf16=*/0,
                  /*collective=*/0.5, /*host_link=*/0.5,   /*memory=*/0.5,
                  /*host_memory=*/0.5};
  return p;
}

TEST(TimeModelAccumTest, DdpReducesOnTheLastMicroBatchOnly) {
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  in.forward_flops = 1e12;   // 2 s per micro-batch
  in.backward_flops = 2e12;  // 4 s per micro-batch
  in.unit_padded_numel = {50'000'000};
  in.batch = 4;
  in.seq_len = 128;
  in.world_size = 2;
  in.shard_group_size = 2;
  in.grad_accum = 3;
  const StepTime t = estimate_step_time(in, fake_device());
  EXPECT_DOUBLE_EQ(t.forward_compute_s, 6);
  EXPECT_DOUBLE_EQ(t.backward_compute_s, 12);
  // One all-reduce per step, as without accumulation (time_model_test's
  // DdpByHand): 2e8 B, 0.04 s, of which the last bucket's 0.00524288 s shows.
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2e8);
  EXPECT_DOUBLE_EQ(t.comm_s, 0.04);
  EXPECT_NEAR(t.exposed_comm_s, 0.00524288, 1e-12);
  EXPECT_NEAR(t.step_time_s, 6 + 12 + 0.00524288 + 0.028, 1e-12);
  // 4 sequences x 3 micro-batches x 128 tokens x 2 ranks.
  EXPECT_NEAR(t.tokens_per_s, 3072 / t.step_time_s, 1e-9);
}

TEST(TimeModelAccumTest, Zero3OffloadCommunicatesEveryMicroBatch) {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3+offload/fp16/wrap=size:2000");
  in.forward_flops = 2e12;   // 1 s per micro-batch
  in.backward_flops = 4e12;  // 2 s
  in.unit_padded_numel = {10'000'000, 20'000'000, 20'000'000};
  in.batch = 1;
  in.seq_len = 1000;
  in.world_size = 4;
  in.shard_group_size = 4;
  in.grad_accum = 2;
  const StepTime t = estimate_step_time(in, fake_device());
  // Per micro-batch as in time_model_test's Zero3OffloadMixedPrecisionByHand:
  // 3 collectives of 7.5e7 B (0.045 s, 0.012 s exposed), forward 1.003 s,
  // backward 2.009 s, 3 fp32 shard copies over the host link (0.15 s).
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2 * 3 * 7.5e7);
  EXPECT_NEAR(t.comm_s, 2 * 0.045, 1e-12);
  EXPECT_NEAR(t.exposed_comm_s, 2 * 0.012, 1e-12);
  EXPECT_DOUBLE_EQ(t.host_link_bytes, 2 * 1.5e8);
  EXPECT_NEAR(t.offload_s, 0.3, 1e-12);
  // One optimizer step on the host: 0.07 s.
  EXPECT_NEAR(t.optimizer_s, 0.07, 1e-12);
  EXPECT_NEAR(t.step_time_s, 2 * (1.003 + 2.009) + 0.3 + 0.07, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 8000 / t.step_time_s, 1e-9);
}

TEST(TimeModelAccumTest, Zero1OffloadCopiesOncePerStep) {
  // zero1 reduces, copies its grad slice out and its updated slice back once
  // per step, whatever the micro-batches.
  StepTimeInputs in;
  in.candidate = parse_candidate("zero1+offload/fp32/wrap=none");
  in.forward_flops = in.backward_flops = 1e9;
  in.unit_padded_numel = {1'000'000};
  in.world_size = in.shard_group_size = 2;
  const StepTime one = estimate_step_time(in, fake_device());
  in.grad_accum = 4;
  const StepTime four = estimate_step_time(in, fake_device());
  EXPECT_DOUBLE_EQ(four.host_link_bytes, one.host_link_bytes);
  EXPECT_DOUBLE_EQ(four.intra_node_comm_bytes, one.intra_node_comm_bytes);
  EXPECT_GT(four.tokens_per_s, one.tokens_per_s);  // the fixed costs amortize
}

TEST(TimeModelAccumTest, RejectsGradAccumBelowOne) {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3/fp32/wrap=block");
  in.unit_padded_numel = {100};
  in.grad_accum = 0;
  EXPECT_THROW(estimate_step_time(in, fake_device()), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::planner
