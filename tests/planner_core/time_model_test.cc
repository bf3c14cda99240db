// Time model: exact answers on a fake device with round numbers (worked by
// hand in the comments), then the physics the plan ranks by on a real
// profile: more sharding moves more bytes, offload costs time, tensor cores
// speed up mixed precision.
#include "planner/time_model.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "planner/adamw_steps.h"

namespace shardfit::planner {
namespace {

const std::string kProfilesDir = std::string(SHARDFIT_SOURCE_DIR) + "/profiles";

// Round numbers so every expected value below is worked out by hand.
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

// fake_device() whose link pays 1 ms a collective.
DeviceProfile device_with_latency() {
  DeviceProfile p = fake_device();
  p.gpu_link.latency_s = 1e-3;
  return p;
}

// zero3 by block over 2 ranks, three units of 1000 elements.
StepTimeInputs zero3_three_units() {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3/fp32/wrap=block");
  in.unit_padded_numel = {1000, 1000, 1000};
  in.world_size = in.shard_group_size = 2;
  return in;
}

// fake_device with kernels measured as `shardfit calibrate` measures them:
// a 1 us dispatch, every product of the {16, 256} grid at 1e11 FLOP/s.
DeviceProfile fake_device_by_op() {
  DeviceProfile p = fake_device();
  p.measured_kernels.op_overhead_s = 1e-6;
  p.measured_kernels.matmul_dims = {16, 256};
  p.measured_kernels.matmul_flops_per_s[DType::kF32] = std::vector<double>(8, 1e11);
  return p;
}

TEST(TimeModelTest, RingVolumes) {
  EXPECT_DOUBLE_EQ(all_gather_bytes_per_rank(100, 4), 75);
  EXPECT_DOUBLE_EQ(reduce_scatter_bytes_per_rank(100, 4), 75);
  EXPECT_DOUBLE_EQ(all_reduce_bytes_per_rank(100, 4), 150);
  EXPECT_DOUBLE_EQ(all_reduce_bytes_per_rank(100, 1), 0);  // alone: nothing to send
}

TEST(TimeModelTest, DdpByHand) {
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  in.forward_flops = 1e12;   // / (1e12 × 0.5) = 2 s
  in.backward_flops = 2e12;  // 4 s
  in.unit_padded_numel = {50'000'000};
  in.batch = 4;
  in.seq_len = 128;
  in.world_size = 2;
  in.shard_group_size = 2;
  StepTime t = estimate_step_time(in, fake_device());

  EXPECT_DOUBLE_EQ(t.forward_compute_s, 2);
  EXPECT_DOUBLE_EQ(t.backward_compute_s, 4);
  // All-reduce of 2e8 grad bytes over 2 ranks: 2·(1/2)·2e8 = 2e8 bytes at
  // 10e9 × 0.5 = 5e9 B/s = 0.04 s, after the one unit's backward: nothing
  // is left to hide it behind, reduced asynchronously or not.
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2e8);
  EXPECT_DOUBLE_EQ(t.comm_s, 0.04);
  EXPECT_NEAR(t.exposed_comm_s, 0.04, 1e-12);
  in.schedule.async_reduce = true;
  EXPECT_NEAR(estimate_step_time(in, fake_device()).exposed_comm_s, 0.04, 1e-12);
  // AdamW on device: 5e7 × 4 B × (3 + 2·2) = 1.4e9 B at 100e9 × 0.5 = 0.028 s.
  EXPECT_DOUBLE_EQ(t.optimizer_s, 0.028);
  EXPECT_DOUBLE_EQ(t.offload_s, 0);
  EXPECT_NEAR(t.step_time_s, 2 + 4 + 0.04 + 0.028, 1e-12);
  // Global tokens: 4 × 128 × 2 ranks per step.
  EXPECT_NEAR(t.tokens_per_s, 1024 / t.step_time_s, 1e-9);
}

// PyTorch's autocast (AMP) computes in fp16 but keeps fp32 parameters, so
// DDP all-reduces fp32 gradients: reduce_elem_bytes 4 doubles the fp16 bytes.
TEST(TimeModelTest, AutocastKeepsFp32GradientsForDdp) {
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp16/wrap=none");
  in.forward_flops = 1e12;  // / (8e12 × 0.25) = 0.5 s
  in.unit_padded_numel = {50'000'000};
  in.world_size = 2;
  in.shard_group_size = 2;
  // fp16 gradients: 2·(1/2)·1e8 B = 1e8 B at 5e9 B/s = 0.02 s.
  EXPECT_DOUBLE_EQ(estimate_step_time(in, fake_device()).intra_node_comm_bytes, 1e8);
  in.reduce_elem_bytes = 4;
  const StepTime t = estimate_step_time(in, fake_device());
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2e8);
  EXPECT_DOUBLE_EQ(t.comm_s, 0.04);
  EXPECT_DOUBLE_EQ(t.forward_compute_s, 0.5);
}

TEST(TimeModelTest, DdpAsyncReduceHidesAllButTheFirstUnitsAllReduce) {
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=block");
  in.forward_flops = 1e12;   // 2 s
  in.backward_flops = 2e12;  // 4 s: hides any all-reduce in flight
  in.unit_padded_numel = {10'000'000, 40'000'000};
  in.world_size = in.shard_group_size = 2;
  // Synchronous (the default): each unit's all-reduce is waited for after its
  // backward; the whole 0.04 s of DdpByHand's 2e8 bytes shows.
  EXPECT_NEAR(estimate_step_time(in, fake_device()).exposed_comm_s, 0.04, 1e-12);
  // --async-reduce: in flight until backward ends; the first unit's, 4e7 B
  // at 5e9 B/s, starts last and shows.
  in.schedule.async_reduce = true;
  const StepTime t = estimate_step_time(in, fake_device());
  EXPECT_DOUBLE_EQ(t.comm_s, 0.04);
  EXPECT_NEAR(t.exposed_comm_s, 0.008, 1e-12);
  EXPECT_NEAR(t.step_time_s, 2 + 4 + 0.008 + 0.028, 1e-12);
}

// DDP's buckets (spec/grad_buckets.h) instead of units: the same bytes, one
// latency per bucket, and with --async-reduce only the last bucket shows.
TEST(TimeModelTest, DdpBucketsPayALatencyEachAndExposeTheLastBucket) {
  const DeviceProfile p = device_with_latency();
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  in.forward_flops = 1e12;
  in.backward_flops = 2e12;
  in.unit_padded_numel = {50'000'000};
  in.grad_bucket_numel = {250'000, 24'750'000, 25'000'000};  // launch order
  in.world_size = in.shard_group_size = 2;
  // 2e8 B all-reduced between 2 ranks at 5e9 B/s: 0.04 s, plus 3 latencies.
  EXPECT_NEAR(estimate_step_time(in, p).exposed_comm_s, 0.04 + 3e-3, 1e-12);
  in.schedule.async_reduce = true;
  const StepTime t = estimate_step_time(in, p);
  EXPECT_NEAR(t.comm_s, 0.043, 1e-12);
  // The last bucket, 1e8 B: 0.02 s and its latency.
  EXPECT_NEAR(t.exposed_comm_s, 0.021, 1e-12);
}

TEST(TimeModelTest, Zero3OffloadMixedPrecisionByHand) {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3+offload/fp16/wrap=size:2000");
  in.forward_flops = 2e12;   // / (8e12 × 0.25) = 1 s
  in.backward_flops = 4e12;  // 2 s
  in.unit_padded_numel = {10'000'000, 20'000'000, 20'000'000};
  in.batch = 1;
  in.seq_len = 1000;
  in.world_size = 4;
  in.shard_group_size = 4;
  // Synchronous collectives (the default): all 3 × 0.015 s show.
  EXPECT_NEAR(estimate_step_time(in, fake_device()).exposed_comm_s, 0.045, 1e-12);
  // --prefetch 2 --async-reduce --async-gather: FSDP's overlap.
  in.schedule.prefetch = 2;
  in.schedule.async_reduce = in.schedule.async_gather = true;
  StepTime t = estimate_step_time(in, fake_device());

  // One gather of the model in fp16: (3/4)·5e7·2 B = 7.5e7 B / 5e9 = 0.015 s;
  // forward: AG; backward: AG + RS. Exposed: the first unit's forward AG
  // (1e7 elements: 0.003 s), in backward the last unit's re-gather (0.006 s)
  // and the first unit's RS (0.003 s).
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 3 * 7.5e7);
  EXPECT_NEAR(t.comm_s, 0.045, 1e-12);
  EXPECT_NEAR(t.exposed_comm_s, 0.012, 1e-12);
  // --prefetch 1: forward prefetches nothing (prefetch - 1 units), so every
  // forward gather shows: 0.015 s in place of 0.003 s.
  in.schedule.prefetch = 1;
  EXPECT_NEAR(estimate_step_time(in, fake_device()).exposed_comm_s, 0.015 + 0.006 + 0.003, 1e-12);
  in.schedule.prefetch = 2;
  // Offload: shard = 1.25e7 params; 2 param copies in + 1 grad copy out, fp32:
  // 3 × 5e7 B = 1.5e8 B at 2e9 × 0.5 = 0.15 s. CPU AdamW: 1.25e7 × 28 B =
  // 3.5e8 B at 10e9 × 0.5 = 0.07 s.
  EXPECT_DOUBLE_EQ(t.host_link_bytes, 1.5e8);
  EXPECT_NEAR(t.offload_s, 0.15, 1e-12);
  EXPECT_NEAR(t.optimizer_s, 0.07, 1e-12);
  EXPECT_NEAR(t.step_time_s, 1.003 + 2.009 + 0.15 + 0.07, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 4000 / t.step_time_s, 1e-9);
  // Gradients reduced in fp32 (FSDP2's reduce_dtype=float32): the
  // reduce-scatter moves 1.5e8 B (0.03 s), the two gathers stay fp16; the
  // first unit's RS, exposed, 0.006 s.
  in.schedule.prefetch = 1;
  in.reduce_elem_bytes = 4;
  t = estimate_step_time(in, fake_device());
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2 * 7.5e7 + 1.5e8);
  EXPECT_NEAR(t.comm_s, 0.06, 1e-12);
  EXPECT_NEAR(t.exposed_comm_s, 0.015 + 0.006 + 0.006, 1e-12);
}

TEST(TimeModelTest, HybridAddsAnInterNodeAllReduceOfTheShard) {
  StepTimeInputs in;
  in.candidate = parse_candidate("hybrid/fp32/wrap=block");
  in.forward_flops = 1e12;   // 2 s: hides every overlappable collective
  in.backward_flops = 2e12;  // 4 s
  in.unit_padded_numel = {10'000'000, 40'000'000};
  in.world_size = 4;
  in.shard_group_size = 2;
  in.nodes = 2;
  in.schedule.prefetch = 2;
  in.schedule.async_reduce = in.schedule.async_gather = true;
  StepTime t = estimate_step_time(in, fake_device());
  // Inside a node (2 ranks): (1/2)·5e7·4 B = 1e8 B per collective, 3 of them.
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 3e8);
  // Across nodes: all-reduce of the 2.5e7-element shard, fp32, 2 nodes:
  // 2·(1/2)·1e8 = 1e8 B at 1e9 × 0.5 = 0.2 s, exposed: the first unit's,
  // 5e6 elements: 0.04 s.
  EXPECT_DOUBLE_EQ(t.inter_node_comm_bytes, 1e8);
  // Exposed inside the node: the first unit's gather and reduce-scatter, 2e7
  // B each at 5e9 B/s = 0.004 s, and the last unit's backward re-gather, 8e7
  // B = 0.016 s; plus 0.04 s across nodes.
  EXPECT_NEAR(t.exposed_comm_s, 0.004 + 0.016 + 0.004 + 0.04, 1e-12);
  EXPECT_NEAR(t.comm_s, 3 * 0.02 + 0.2, 1e-12);
}

TEST(TimeModelTest, RejectsInconsistentInputs) {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3/bf16/wrap=block");
  in.unit_padded_numel = {100};
  EXPECT_THROW(estimate_step_time(in, fake_device()), std::invalid_argument);  // no bf16
  in.candidate = parse_candidate("zero3/fp32/wrap=block");
  in.unit_padded_numel = {};
  EXPECT_THROW(estimate_step_time(in, fake_device()), std::invalid_argument);
  in.unit_padded_numel = {100};
  in.world_size = 3;
  in.shard_group_size = 2;
  EXPECT_THROW(estimate_step_time(in, fake_device()), std::invalid_argument);
  in.shard_group_size = 3;
  in.batch = 0;
  EXPECT_THROW(estimate_step_time(in, fake_device()), std::invalid_argument);
}

// GPT-2 Large-sized step on 2 Titan RTX, as in the reference: 774M params in
// 38 units (embeddings + 36 blocks + the rest), `batch` sequences of 128.
StepTime gpt2_large_on_titans(const std::string& id, int64_t batch = 8) {
  static const DeviceProfile titan = load_profile("titan-rtx-24gb", kProfilesDir);
  StepTimeInputs in;
  in.candidate = parse_candidate(id);
  const double params = 774'030'080, tokens = static_cast<double>(batch) * 128;
  in.forward_flops = 2 * params * tokens;
  in.backward_flops = 4 * params * tokens * (in.candidate.recompute ? 1.5 : 1.0);
  if (in.candidate.wrap == "none") {
    in.unit_padded_numel = {774'030'080};
  } else {
    in.unit_padded_numel.push_back(64'000'000);  // sums to 774,030,080
    for (int i = 0; i < 36; ++i) in.unit_padded_numel.push_back(19'680'000);
    in.unit_padded_numel.push_back(1'550'080);
  }
  in.batch = batch;
  in.seq_len = 128;
  in.world_size = 2;
  in.shard_group_size = 2;
  // With everything that can overlap overlapped (--prefetch 2
  // --async-reduce --async-gather), as FSDP runs: what ranks strategies.
  in.schedule.prefetch = 2;
  in.schedule.async_reduce = in.schedule.async_gather = true;
  return estimate_step_time(in, titan);
}

TEST(TimeModelTest, MoreShardingMovesMoreBytes) {
  StepTime ddp = gpt2_large_on_titans("ddp/fp32/wrap=none");
  StepTime zero1 = gpt2_large_on_titans("zero1/fp32/wrap=none");
  StepTime zero2 = gpt2_large_on_titans("zero2/fp32/wrap=size:1000000");
  StepTime zero3 = gpt2_large_on_titans("zero3/fp32/wrap=size:1000000");
  // ZeRO-2 moves exactly what DDP moves (all-gather + reduce-scatter =
  // all-reduce, as the ZeRO paper says); ZeRO-1 adds a param all-gather;
  // ZeRO-3 gathers again in backward: 1.5x DDP.
  EXPECT_DOUBLE_EQ(zero2.intra_node_comm_bytes, ddp.intra_node_comm_bytes);
  EXPECT_NEAR(zero2.comm_s, ddp.comm_s, 1e-12);
  EXPECT_GT(zero1.comm_s, ddp.comm_s);
  EXPECT_GT(zero3.comm_s, zero2.comm_s);
  EXPECT_NEAR(zero3.intra_node_comm_bytes, 1.5 * ddp.intra_node_comm_bytes, 1);
  EXPECT_GE(zero3.step_time_s, zero2.step_time_s);
  // Where communication dominates (batch 1), the extra gathers show.
  EXPECT_GT(gpt2_large_on_titans("zero3/fp32/wrap=size:1000000", 1).step_time_s,
            gpt2_large_on_titans("zero2/fp32/wrap=size:1000000", 1).step_time_s);
}

TEST(TimeModelTest, OneUnitHidesNothing) {
  // wrap=none: the single gather must finish before any compute starts.
  StepTime none = gpt2_large_on_titans("zero3/fp32/wrap=none");
  StepTime blocks = gpt2_large_on_titans("zero3/fp32/wrap=block");
  EXPECT_NEAR(none.comm_s, blocks.comm_s, 1e-9);
  EXPECT_NEAR(none.exposed_comm_s, none.comm_s, 1e-9);
  EXPECT_GT(none.step_time_s, blocks.step_time_s);
}

TEST(TimeModelTest, DdpFp16IsTheFastestAsInTheReference) {
  double fp16 = gpt2_large_on_titans("ddp/fp16/wrap=none").step_time_s;
  for (const char* id : {"ddp/fp32/wrap=none", "zero2/fp32/wrap=size:1000000",
                         "zero3/fp32/wrap=size:2000", "zero3+offload/fp32/wrap=size:2000"})
    EXPECT_LT(fp16, gpt2_large_on_titans(id).step_time_s) << id;
}

TEST(TimeModelTest, OffloadCostsTime) {
  for (const char* sharding : {"zero1", "zero2", "zero3"}) {
    std::string wrap = std::string(sharding) == "zero1" ? "none" : "size:2000";
    StepTime on_device = gpt2_large_on_titans(std::string(sharding) + "/fp32/wrap=" + wrap);
    StepTime offload = gpt2_large_on_titans(std::string(sharding) + "+offload/fp32/wrap=" + wrap);
    EXPECT_GT(offload.step_time_s, on_device.step_time_s) << sharding;
    EXPECT_GT(offload.offload_s, 0) << sharding;
    EXPECT_GT(offload.optimizer_s, on_device.optimizer_s) << sharding << ": CPU AdamW is slower";
  }
}

TEST(TimeModelTest, TensorCoresSpeedUpMixedPrecision) {
  StepTime fp32 = gpt2_large_on_titans("ddp/fp32/wrap=none");
  StepTime fp16 = gpt2_large_on_titans("ddp/fp16/wrap=none");
  EXPECT_LT(fp16.compute_s, fp32.compute_s);
  EXPECT_LT(fp16.comm_s, fp32.comm_s);  // half the bytes
  EXPECT_LT(fp16.step_time_s, fp32.step_time_s);
  EXPECT_GT(fp16.tokens_per_s, fp32.tokens_per_s);
}

TEST(TimeModelTest, CheckpointingCostsRecompute) {
  EXPECT_GT(gpt2_large_on_titans("zero3+ckpt/fp32/wrap=block").step_time_s,
            gpt2_large_on_titans("zero3/fp32/wrap=block").step_time_s);
}

TEST(TimeModelTest, OneRankCommunicatesNothing) {
  StepTimeInputs in;
  in.candidate = parse_candidate("zero3/fp32/wrap=block");
  in.forward_flops = 1e9;
  in.backward_flops = 2e9;
  in.unit_padded_numel = {1000, 2000};
  const DeviceProfile p = device_with_latency();  // a measured latency: still no collective to pay it
  StepTime t = estimate_step_time(in, p);
  EXPECT_EQ(t.comm_s, 0);
  EXPECT_EQ(t.exposed_comm_s, 0);
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  EXPECT_EQ(estimate_step_time(in, p).comm_s, 0);
}

// Gradient accumulation (StepTimeInputs::grad_accum), on the same fake
// device: k micro-batches run forward and backward k times; sharded
// strategies communicate (and offload copies) on each, ddp/zero1 all-reduce
// after the last only; tokens count all k.
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
  // DdpByHand): 2e8 B, 0.04 s, all of it shown.
  EXPECT_DOUBLE_EQ(t.intra_node_comm_bytes, 2e8);
  EXPECT_DOUBLE_EQ(t.comm_s, 0.04);
  EXPECT_NEAR(t.exposed_comm_s, 0.04, 1e-12);
  EXPECT_NEAR(t.step_time_s, 6 + 12 + 0.04 + 0.028, 1e-12);
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
  in.schedule.prefetch = 2;
  in.schedule.async_reduce = in.schedule.async_gather = true;
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

// A profile with kernels measured on the machine (shardfit calibrate) times
// each op: products at their shape's rate, named kernels at theirs, the rest
// at the memory bandwidth, one dispatch overhead per kernel and node.
TEST(TimeModelByOpTest, TimesEachOpAtItsMeasuredRate) {
  DeviceProfile p = fake_device_by_op();
  // m-major over (m, n, k): every point 1e11 but (256, 256, 256) at 4e11.
  p.measured_kernels.matmul_flops_per_s[DType::kF32].back() = 4e11;
  p.measured_kernels.kernel_bytes_per_s[DType::kF32]["aten::gelu"] = 1e9;
  p.measured_kernels.kernel_bytes_per_s[DType::kBF16]["aten::add"] = 1;  // another dtype's: unused
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  in.unit_padded_numel = {1000};
  in.forward_flops = in.backward_flops = 1;  // ignored: the work is timed
  // Forward: a 256^3 product (2^25 FLOPs at 4e11), two bmm calls of 16^3 (2 × 8192 at
  // 1e11), gelu's 1e6 bytes at 1e9 (1 ms), an add's 1e8 bytes at 100e9 (1 ms), 3 kernels.
  in.forward_work.gemms = {{1, 256, 256, 256}, {2, 16, 16, 16}};
  in.forward_work.add_kernel("aten::gelu", 1e6);
  in.forward_work.add_kernel("aten::add", 5e7);
  in.forward_work.add_kernel("aten::add", 5e7);
  // Backward: one node and its 16 x 256 x 16 product, between the grid's
  // points: log-linear in n, so the geometric mean of 1e11 and 1e11 = 1e11.
  in.backward_work.gemms = {{1, 16, 64, 16}};
  in.backward_work.nodes = 1;
  const double fwd = 33554432 / 4e11 + 16384 / 1e11 + 1e-3 + 1e-3 + 3 * 1e-6;
  const double bwd = 2.0 * 16 * 64 * 16 / 1e11 + 1e-6;
  const StepTime t = estimate_step_time(in, p);
  EXPECT_NEAR(t.forward_compute_s, fwd, 1e-15);
  EXPECT_NEAR(t.backward_compute_s, bwd, 1e-15);
  // Without the work (a trace file from before it) the FLOPs divide by one rate.
  in.forward_work = {};
  EXPECT_DOUBLE_EQ(estimate_step_time(in, p).forward_compute_s, 1 / (1e12 * 0.5));
}

// A timed step of `candidate` over one unit of 1000 elements, whose
// optimizer's dispatch is what the tests below vary.
StepTimeInputs optimizer_inputs(const char* candidate) {
  StepTimeInputs in;
  in.candidate = parse_candidate(candidate);
  in.unit_padded_numel = {1000};
  in.forward_work.add_kernel("aten::add", 8);
  in.backward_work.nodes = 1;
  return in;
}

// PyTorch's optimizer step pays a dispatch for each op it runs: the
// for-loop AdamW's ten a parameter, not the fused step's four in all; a
// profile without measured kernels times the step by its bytes alone.
TEST(TimeModelByOpTest, TheOptimizerPaysADispatchPerOpItRuns) {
  DeviceProfile p = fake_device_by_op();
  StepTimeInputs in = optimizer_inputs("ddp/fp32/wrap=none");
  const double bytes_only = estimate_step_time(in, p).optimizer_s;
  in.optimizer_ops = adamw_step_ops(AdamwStep::kForLoop, 21);
  EXPECT_EQ(in.optimizer_ops, 212);  // llama-tiny's 21 parameters, as torch 2.11 counts them
  EXPECT_NEAR(estimate_step_time(in, p).optimizer_s, bytes_only + 212e-6, 1e-15);
  in.optimizer_ops = adamw_step_ops(AdamwStep::kForeach, 21);
  EXPECT_NEAR(estimate_step_time(in, p).optimizer_s, bytes_only + 54e-6, 1e-15);
  in.optimizer_ops = adamw_step_ops(AdamwStep::kFused, 21);
  EXPECT_NEAR(estimate_step_time(in, p).optimizer_s, bytes_only + 4e-6, 1e-15);
  p.measured_kernels = {};
  EXPECT_DOUBLE_EQ(estimate_step_time(in, p).optimizer_s, bytes_only);
}

// A dispatch measured whole (calibrate --stack pytorch: AdamW's step over
// DTensors, say) replaces the count of ops times one op's dispatch.
TEST(TimeModelByOpTest, AMeasuredOptimizerDispatchReplacesTheOpCount) {
  DeviceProfile p = fake_device_by_op();
  StepTimeInputs in = optimizer_inputs("zero3/fp32/wrap=none");
  const double bytes_only = estimate_step_time(in, p).optimizer_s;
  in.optimizer_ops = 212;
  in.optimizer_dispatch_s = 1e-3 + 21 * 1e-4;  // llama-tiny's 21 DTensors, a made-up line
  EXPECT_NEAR(estimate_step_time(in, p).optimizer_s, bytes_only + 3.1e-3, 1e-15);
  in.optimizer_dispatch_s = 0;  // not measured: one dispatch per op
  EXPECT_NEAR(estimate_step_time(in, p).optimizer_s, bytes_only + 212e-6, 1e-15);
}

TEST(TimeModelByOpTest, MatmulRateInterpolatesInLogSpaceAndClampsToTheGrid) {
  MeasuredKernels k;
  k.matmul_dims = {16, 256};
  k.matmul_flops_per_s[DType::kF32] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 16e9};
  EXPECT_NEAR(k.matmul_rate(DType::kF32, {1, 256, 256, 256}), 16e9, 1e-3);
  EXPECT_NEAR(k.matmul_rate(DType::kF32, {1, 4096, 50000, 300}), 16e9, 1e-3);  // beyond: the edge
  EXPECT_NEAR(k.matmul_rate(DType::kF32, {1, 8, 8, 8}), 1e9, 1e-3);
  // m = n = 256, k = 64: halfway in log(k) between 1e9 and 16e9: 4e9.
  EXPECT_NEAR(k.matmul_rate(DType::kF32, {1, 256, 256, 64}), 4e9, 1e-3);
}

// A measured latency is paid per collective, and the engine's gathers and
// reduce-scatters on Gloo move an all-reduce's bytes.
TEST(TimeModelByOpTest, CollectivesPayLatencyAndGlooGathersMoveAllReduceBytes) {
  const DeviceProfile p = device_with_latency();
  StepTimeInputs in = zero3_three_units();
  // 3 gathers forward, 3 again and 3 reduce-scatters backward, each of
  // 4000 B × 1/2 at 5e9 B/s plus 1 ms.
  const double one = 2000 / 5e9;
  EXPECT_NEAR(estimate_step_time(in, p).comm_s, 9 * one + 9e-3, 1e-12);
  in.gathers_via_all_reduce = true;
  EXPECT_NEAR(estimate_step_time(in, p).comm_s, 9 * 2 * one + 9e-3, 1e-12);
  EXPECT_DOUBLE_EQ(estimate_step_time(in, p).intra_node_comm_bytes, 3 * 2 * 3 * 2000);
}

// FSDP2's hooks measured whole (calibrate --stack pytorch) run on the
// compute thread: each phase pays them on every micro-batch, and its
// gathers and reduce-scatters then pay their bytes alone, the latency being
// inside what was measured.
TEST(TimeModelByOpTest, MeasuredHooksAddToEachPhaseInPlaceOfTheLatency) {
  const DeviceProfile p = device_with_latency();
  StepTimeInputs in = zero3_three_units();
  const StepTime plain = estimate_step_time(in, p);
  in.forward_hooks_s = 4e-3;
  in.backward_hooks_s = 7e-3;
  const StepTime hooked = estimate_step_time(in, p);
  EXPECT_NEAR(hooked.forward_compute_s, plain.forward_compute_s + 4e-3, 1e-15);
  EXPECT_NEAR(hooked.backward_compute_s, plain.backward_compute_s + 7e-3, 1e-15);
  EXPECT_NEAR(hooked.comm_s, plain.comm_s - 9e-3, 1e-12);  // 9 collectives, no latency each
  in.grad_accum = 3;
  EXPECT_NEAR(estimate_step_time(in, p).compute_s, 3 * hooked.compute_s, 1e-12);
  in.backward_hooks_s = -1;
  EXPECT_THROW(estimate_step_time(in, p), std::invalid_argument);
}

// DDP's hooks measured whole: the forward pays them on every micro-batch,
// the backward only on the one that reduces (the others run under
// no_sync), and its bucket all-reduces then pay their bytes alone.
TEST(TimeModelByOpTest, DdpHooksPayTheBackwardOnceAStepInPlaceOfTheLatency) {
  const DeviceProfile p = device_with_latency();
  StepTimeInputs in;
  in.candidate = parse_candidate("ddp/fp32/wrap=none");
  in.unit_padded_numel = {1000, 1000, 1000};  // three buckets
  in.grad_bucket_numel = {1000, 1000, 1000};
  in.world_size = in.shard_group_size = 2;
  in.grad_accum = 4;
  const StepTime plain = estimate_step_time(in, p);
  in.forward_hooks_s = 4e-3;
  in.backward_hooks_s = 7e-3;
  const StepTime hooked = estimate_step_time(in, p);
  EXPECT_NEAR(hooked.forward_compute_s, plain.forward_compute_s + 4 * 4e-3, 1e-15);
  EXPECT_NEAR(hooked.backward_compute_s, plain.backward_compute_s + 7e-3, 1e-15);
  EXPECT_NEAR(hooked.comm_s, plain.comm_s - 3e-3, 1e-12);  // 3 all-reduces, no latency each
  // All of it exposed here (no compute to hide behind): the step grows by
  // the hooks and shrinks by the latencies.
  EXPECT_NEAR(hooked.step_time_s - plain.step_time_s, 4 * 4e-3 + 7e-3 - 3e-3, 1e-12);
}

// zero1's parameters shared after the step: one all-gather a unit, or, as
// PyTorch's ZeroRedundancyOptimizer issues them, a broadcast a parameter,
// each paying the latency or what a broadcast measured; the bytes are the
// same either way.
TEST(TimeModelByOpTest, Zero1PaysALatencyForEachCollectiveAfterTheStep) {
  const DeviceProfile p = device_with_latency();
  StepTimeInputs in;
  in.candidate = parse_candidate("zero1/fp32/wrap=block");
  in.unit_padded_numel = {1000, 1000};
  in.world_size = in.shard_group_size = 2;
  const StepTime by_unit = estimate_step_time(in, p);
  in.post_step_collectives = 21;
  const StepTime by_param = estimate_step_time(in, p);
  EXPECT_NEAR(by_param.step_time_s - by_unit.step_time_s, 19e-3, 1e-12);
  EXPECT_NEAR(by_param.comm_s - by_unit.comm_s, 19e-3, 1e-12);
  EXPECT_DOUBLE_EQ(by_param.intra_node_comm_bytes, by_unit.intra_node_comm_bytes);
  // A broadcast measured as PyTorch issues it (calibrate --stack pytorch)
  // replaces the latency: 21 of 2.5 ms, 31.5 ms more than 21 of 1 ms.
  in.post_step_collective_s = 2.5e-3;
  EXPECT_NEAR(estimate_step_time(in, p).step_time_s - by_param.step_time_s, 21 * 1.5e-3, 1e-12);
  in.world_size = in.shard_group_size = 1;  // one rank broadcasts nothing
  in.post_step_collective_s = 0;
  const double alone = estimate_step_time(in, p).step_time_s;
  in.post_step_collective_s = 2.5e-3;
  EXPECT_DOUBLE_EQ(estimate_step_time(in, p).step_time_s, alone);
}

}  // namespace
}  // namespace shardfit::planner
