// The step simulator on a hand-built trace with exact byte answers.
//
// Model: root "" (param 10 elements) with blocks "l0" (7) and "l1" (5);
// wrap=block gives three units: root, l0, l1. World 2 (shard group 2):
//   padded P = 10, 8, 6 (sum 24); shard s = 5, 4, 3 (sum 12).
//   ddp does not pad: P = 10, 7, 5 (sum 22).
// Trace (activation bytes):
//   forward:  root{ A16  l0{ B20 T30 ~T }  l1{ C12 }  L4 }
//   backward: root{ l1{ G1:60 ~C }  l0{ G0:4 ~B ~G1 }  ~A ~G0 }
// L (the loss) is still live at the end and is freed before the optimizer.
// Live activations at G1 = A+B+C+L+G1 = 112; at G0 = A+B+L+G1+G0 = 104.
#include "planner/step_simulator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

namespace shardfit::planner {
namespace {

constexpr int kParams = static_cast<int>(Category::kParams);
constexpr int kGrads = static_cast<int>(Category::kGrads);
constexpr int kOptimizer = static_cast<int>(Category::kOptimizer);
constexpr int kActivations = static_cast<int>(Category::kActivations);
constexpr int kCommBuffers = static_cast<int>(Category::kCommBuffers);
constexpr int kTemporaries = static_cast<int>(Category::kTemporaries);

class TraceBuilder {
 public:
  explicit TraceBuilder(ModelTrace* t) : t_(t) {}
  void begin(int module, Phase phase) { push(MemEvent::kModuleBegin, phase, module, -1, 0); }
  void end(int module, Phase phase) { push(MemEvent::kModuleEnd, phase, module, -1, 0); }
  void alloc(int64_t tensor, int64_t bytes, Phase phase, int module = 0) {
    push(MemEvent::kAlloc, phase, module, tensor, bytes);
  }
  void free(int64_t tensor, Phase phase, int module = 0) {
    push(MemEvent::kFree, phase, module, tensor, 0);
  }

 private:
  void push(MemEvent::Kind kind, Phase phase, int module, int64_t tensor, int64_t bytes) {
    MemEvent e;
    e.kind = kind;
    e.phase = phase;
    e.module = module;
    e.tensor = tensor;
    e.bytes = bytes;
    t_->events.push_back(e);
  }
  ModelTrace* t_;
};

ModuleNode module(const std::string& path, int parent, int64_t numel, bool is_block) {
  ModuleNode m;
  m.path = path;
  m.type = is_block ? "Block" : "Model";
  m.parent = parent;
  m.is_block = is_block;
  m.params.push_back(ParamInfo{(path.empty() ? "emb" : path) + ".weight", {numel}, numel});
  return m;
}

// The trace in the header comment; activation bytes are multiplied by
// `act_scale` (0 = states only).
ModelTrace two_block_trace(DType dtype = DType::kF32, int64_t act_scale = 1) {
  ModelTrace t;
  t.model_name = "two-block";
  t.compute_dtype = dtype;
  t.modules = {module("", -1, 10, false), module("l0", 0, 7, true), module("l1", 0, 5, true)};
  t.modules[0].children = {1, 2};
  TraceBuilder b(&t);
  const Phase F = Phase::kForward, B = Phase::kBackward;
  const int64_t k = act_scale;
  b.begin(0, F);
  b.alloc(100, 16 * k, F);  // A
  b.begin(1, F);
  b.alloc(101, 20 * k, F, 1);  // B
  b.alloc(102, 30 * k, F, 1);  // T
  b.free(102, F, 1);
  b.end(1, F);
  b.begin(2, F);
  b.alloc(103, 12 * k, F, 2);  // C
  b.end(2, F);
  b.alloc(104, 4 * k, F);  // L
  b.end(0, F);
  b.begin(0, B);
  b.begin(2, B);
  b.alloc(105, 60 * k, B, 2);  // G1
  b.free(103, B, 2);
  b.end(2, B);
  b.begin(1, B);
  b.alloc(106, 4 * k, B, 1);  // G0
  b.free(101, B, 1);
  b.free(105, B, 1);
  b.end(1, B);
  b.free(100, B);
  b.free(106, B);
  b.end(0, B);
  return t;
}

// A root (1,000 params) with `blocks` blocks run in order, each allocating
// `allocs_per_block` activations of `bytes` in forward (every other one freed
// at once, the rest kept for backward) and freeing them in backward.
ModelTrace blocks_trace(int blocks, int64_t numel_per_block, int allocs_per_block, int64_t bytes) {
  ModelTrace t;
  t.model_name = "blocks";
  t.modules.push_back(module("", -1, 1000, false));
  for (int i = 0; i < blocks; ++i) {
    t.modules.push_back(module("h." + std::to_string(i), 0, numel_per_block, true));
    t.modules[0].children.push_back(i + 1);
  }
  TraceBuilder b(&t);
  b.begin(0, Phase::kForward);
  for (int i = 1; i <= blocks; ++i) {
    b.begin(i, Phase::kForward);
    for (int k = 0; k < allocs_per_block; ++k) {
      const int64_t id = int64_t{i - 1} * allocs_per_block + k;
      b.alloc(id, bytes * (1 + k % 7), Phase::kForward, i);
      if (k % 2) b.free(id, Phase::kForward, i);
    }
    b.end(i, Phase::kForward);
  }
  b.end(0, Phase::kForward);
  b.begin(0, Phase::kBackward);
  for (int i = blocks; i >= 1; --i) {
    b.begin(i, Phase::kBackward);
    for (int k = 0; k < allocs_per_block; k += 2)
      b.free(int64_t{i - 1} * allocs_per_block + k, Phase::kBackward, i);
    b.end(i, Phase::kBackward);
  }
  b.end(0, Phase::kBackward);
  return t;
}

struct SimRun {
  StepSimResult result;
  int64_t at(const std::string& label) const {
    for (const TimelinePoint& p : result.timeline) {
      if (p.label == label) return p.allocated_bytes;
    }
    ADD_FAILURE() << "no timeline point " << label;
    return -1;
  }
};

SimRun simulate(Sharding sharding, DType dtype = DType::kF32, bool offload = false,
                int prefetch = 1, int64_t act_scale = 1, int64_t budget = kUnlimitedBytes) {
  const ModelTrace trace = two_block_trace(dtype, act_scale);
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  Strategy s;
  s.sharding = sharding;
  s.offload = offload;
  s.compute_dtype = dtype;
  s.world_size = 2;
  s.shard_group_size = 2;
  s.schedule.prefetch = prefetch;
  ExactAllocator allocator(budget);
  return SimRun{StepSimulator(trace, units).simulate(s, allocator)};
}

void expect_breakdown(const StepSimResult& r, int64_t params, int64_t grads, int64_t optimizer,
                      int64_t activations, int64_t comm = 0, int64_t temporaries = 0) {
  EXPECT_EQ(r.peak_breakdown_bytes[kParams], params);
  EXPECT_EQ(r.peak_breakdown_bytes[kGrads], grads);
  EXPECT_EQ(r.peak_breakdown_bytes[kOptimizer], optimizer);
  EXPECT_EQ(r.peak_breakdown_bytes[kActivations], activations);
  EXPECT_EQ(r.peak_breakdown_bytes[kCommBuffers], comm);
  EXPECT_EQ(r.peak_breakdown_bytes[kTemporaries], temporaries);
  int64_t sum = 0;
  for (int64_t b : r.peak_breakdown_bytes) sum += b;
  EXPECT_EQ(sum, r.peak_allocated_bytes);
}

TEST(StepSimulatorTest, DdpFp32) {
  // Persistent: params 4*22 = 88, flat grads 4*22 = 88 (from step 1's
  // backward), AdamW state 8*22 = 176 (from step 1's optimizer). Step 2 at
  // G1: 88 + 88 + 176 + 112 = 464. (Step 2's optimizer: 352 + denom 40.)
  const SimRun run = simulate(Sharding::kDdp);
  EXPECT_EQ(run.result.peak_allocated_bytes, 464);
  EXPECT_EQ(run.result.peak_reserved_bytes, 464);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 88, 88, 176, 112);
  EXPECT_EQ(run.at("init"), 88);
  EXPECT_EQ(run.at("step1/optimizer"), 352);
  EXPECT_FALSE(run.result.oom);
  EXPECT_EQ(run.result.peak_host_bytes, 0);
}

// `run --steps 1` is predicted for the one step it runs: no step 2 in the
// timeline, and the peak is step 1's (AdamW state is created in step 1's
// optimizer, so step 1's backward holds no optimizer state: 88 + 88 + 112).
TEST(StepSimulatorTest, OneStepReplaysInitAndStepOneOnly) {
  const ModelTrace trace = two_block_trace();
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  Strategy s;
  s.world_size = 2;
  s.shard_group_size = 2;
  ExactAllocator allocator(kUnlimitedBytes);
  SimOptions one;
  one.steps = 1;
  const StepSimResult r = StepSimulator(trace, units).simulate(s, allocator, one);
  for (const TimelinePoint& p : r.timeline) EXPECT_EQ(p.label.rfind("step2/", 0), std::string::npos) << p.label;
  EXPECT_EQ(r.timeline.back().label, "step1/optimizer");
  EXPECT_EQ(r.peak_allocated_label.rfind("step1/", 0), 0u) << r.peak_allocated_label;
  EXPECT_LT(r.peak_allocated_bytes, 464);  // the two-step peak (DdpFp32)
  EXPECT_GE(r.peak_allocated_bytes, 88 + 88 + 112);
}

TEST(StepSimulatorTest, Zero1Fp32) {
  // params 4*24 = 96, grads 4*24 = 96, sharded AdamW 8*12 = 96; + 112 at G1.
  const SimRun run = simulate(Sharding::kZero1);
  EXPECT_EQ(run.result.peak_allocated_bytes, 400);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 96, 96, 96, 112);
}

TEST(StepSimulatorTest, Zero2Fp32) {
  // Step 2 at G1: shards 48; root, l0, l1 all still gathered (40 + 32 + 24);
  // unsharded grads of root and l1 (40 + 24); AdamW 96; activations 112.
  // 48 + 96 + 64 + 96 + 112 = 416.
  const SimRun run = simulate(Sharding::kZero2);
  EXPECT_EQ(run.result.peak_allocated_bytes, 416);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 144, 64, 96, 112);
  // After step 1's backward: shards 48 + fp32 shard grads 48 + the loss L 4
  // (freed only when the backward scope ends, just before the optimizer).
  EXPECT_EQ(run.at("step1/backward/root"), 100);
  EXPECT_EQ(run.at("step1/optimizer"), 96 + 96);
  // zero2 keeps l0 gathered after its forward: 48 + 40 + 32 + A16 + B20.
  EXPECT_EQ(run.at("step1/forward/l0"), 156);
}

TEST(StepSimulatorTest, Zero3Fp32WithBackwardPrefetch) {
  // Forward: each block is freed at its forward end; the root stays.
  // Step 1, l1's backward begin: gather l1 (24), prefetch l0 (32), l1's grad
  // (24): 48 + 40 + 24 + 32 + 40 + 24 + A16 B20 C12 L4 = 260, + G1 60 = 320.
  // Step 2 adds AdamW 96: 416, the same live set as zero2 at that point.
  const SimRun run = simulate(Sharding::kZero3);
  EXPECT_EQ(run.result.peak_allocated_bytes, 416);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 144, 64, 96, 112);
  // After l0's forward: 48 + root 40 + A16 + B20 = 124 (l0 resharded).
  EXPECT_EQ(run.at("step1/forward/l0"), 124);
}

TEST(StepSimulatorTest, Zero3Fp32WithoutPrefetchGathersL0Later) {
  // l1's backward without the prefetch peaks at 228 + 60 = 288; l0 is then
  // gathered at its own backward begin. The peak moves to G0 in l0's
  // backward: shards 48 + root 40 + l0 32; grads root 40 + l0 32 + l1's
  // shard grad 12; activations 104: 308 in step 1, 404 in step 2.
  const SimRun run = simulate(Sharding::kZero3, DType::kF32, false, /*prefetch=*/false);
  EXPECT_EQ(run.result.peak_allocated_bytes, 404);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l0");
  expect_breakdown(run.result, 120, 84, 96, 104);
}

TEST(StepSimulatorTest, Zero3PrefetchTwoGathersTheNextUnitInForwardOnceTheOrderIsKnown) {
  const SimRun one = simulate(Sharding::kZero3);
  const SimRun two = simulate(Sharding::kZero3, DType::kF32, false, /*prefetch=*/2);
  // Step 1's forward learns the order: nothing is prefetched in it.
  EXPECT_EQ(two.at("step1/forward/l0"), one.at("step1/forward/l0"));
  // Step 2: l0's pre-forward gathers l1 (24 bytes) too, still there when
  // l0's forward ends.
  EXPECT_EQ(two.at("step2/forward/l0"), one.at("step2/forward/l0") + 24);
  EXPECT_GE(two.result.peak_allocated_bytes, one.result.peak_allocated_bytes);
  // zero2 keeps every unit gathered from forward to backward: nothing changes.
  EXPECT_EQ(simulate(Sharding::kZero2, DType::kF32, false, 2).result.peak_allocated_bytes,
            simulate(Sharding::kZero2).result.peak_allocated_bytes);
}

TEST(StepSimulatorTest, Zero3MixedPrecision) {
  // bf16: unsharded params and grads 2*P (20, 16, 12), casts 2*s (10, 8, 6)
  // before each gather, reduce-scatter outputs 2*s then fp32 shard grads
  // 4*s. Peak at l1's post-backward, while its 2-byte reduce-scatter output
  // (6) and its new fp32 shard grad (12) are both live: shards 48 +
  // gathered 20 + 12 + 16; grads 20 + 12 + 12; AdamW 96; activations 100
  // (C is freed); comm 6. Step 1: 246; step 2: 342.
  const SimRun run = simulate(Sharding::kZero3, DType::kBF16);
  EXPECT_EQ(run.result.peak_allocated_bytes, 342);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 96, 44, 96, 100, /*comm=*/6);
  // The cast is freed right after each gather: after the root's forward
  // begins and A: 48 + 20 + 16 (l0 cast freed, l0 resharded) ...
  // after l0's forward: 48 + root 20 + A16 + B20 = 104.
  EXPECT_EQ(run.at("step1/forward/l0"), 104);
}

TEST(StepSimulatorTest, Zero3OffloadKeepsStateOnTheHost) {
  // Device: no shards, no AdamW; gathers go through 4*s staging. At G1 in
  // step 1: gathered 40 + 24 + 32, grads 40 + 24, activations 112 = 272.
  // Step 2 repeats it exactly, so the peak stays labelled step 1.
  // Host: shards 48 + shard grads 48 + AdamW 96 = 192.
  const SimRun run = simulate(Sharding::kZero3, DType::kF32, /*offload=*/true);
  EXPECT_EQ(run.result.peak_allocated_bytes, 272);
  EXPECT_EQ(run.result.peak_allocated_label, "step1/backward/l1");
  expect_breakdown(run.result, 96, 64, 0, 112);
  EXPECT_EQ(run.result.peak_host_bytes, 192);
  EXPECT_EQ(run.at("init"), 0);
}

TEST(StepSimulatorTest, Zero1OffloadStagesUpdatedShardsBack) {
  // States only. Device: compute params 4*24 = 96 and flat grads 96; after
  // each host update the shard comes back through a 4*s staging buffer (root:
  // 20). Host: master shards 48 + shard grads 48 + AdamW 96 = 192. Step 2
  // repeats step 1 on the device, so the peak is labelled step 1.
  const SimRun run = simulate(Sharding::kZero1, DType::kF32, /*offload=*/true, true, 0);
  EXPECT_EQ(run.result.peak_allocated_bytes, 212);
  EXPECT_EQ(run.result.peak_allocated_label, "step1/optimizer");
  expect_breakdown(run.result, 96, 96, 0, 0, 0, /*temporaries=*/20);
  EXPECT_EQ(run.result.peak_host_bytes, 192);
}

TEST(StepSimulatorTest, Zero2OffloadMixedReduceScattersThroughTheDevice) {
  // States only, bf16. Forward gathers everything (2*P = 20 + 16 + 12 = 48,
  // each through a 2*s staging copy). l1's post-backward: grads root 20 +
  // l1 12, then its 2-byte reduce-scatter output 6 before it goes to the
  // host: 48 + 32 + 6 = 86.
  const SimRun run = simulate(Sharding::kZero2, DType::kBF16, /*offload=*/true, true, 0);
  EXPECT_EQ(run.result.peak_allocated_bytes, 86);
  EXPECT_EQ(run.result.peak_allocated_label, "step1/backward/l1");
  expect_breakdown(run.result, 48, 32, 0, 0, /*comm=*/6);
  EXPECT_EQ(run.result.peak_host_bytes, 192);
}

TEST(StepSimulatorTest, DdpMixedOptimizerTemporaries) {
  // States only. params 4*22 + bf16 copy 2*22 = 132, grads 2*22 = 44, AdamW
  // 176. Step 2's update of the root: fp32 grad copy 40 + denom 40:
  // 132 + 44 + 176 + 80 = 432. (Step 1 peaks at 392, updating l1.)
  const SimRun run = simulate(Sharding::kDdp, DType::kBF16, false, true, /*act_scale=*/0);
  EXPECT_EQ(run.result.peak_allocated_bytes, 432);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/optimizer");
  expect_breakdown(run.result, 132, 44, 176, 0, 0, /*temporaries=*/80);
}

TEST(StepSimulatorTest, Zero1MixedOptimizerTemporaries) {
  // States only. params 4*24 + 2*24 = 144, grads 2*24 = 48, AdamW 8*12 = 96;
  // the root's shard update: fp32 grad copy 20 + denom 20: 328.
  const SimRun run = simulate(Sharding::kZero1, DType::kBF16, false, true, 0);
  EXPECT_EQ(run.result.peak_allocated_bytes, 328);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/optimizer");
  expect_breakdown(run.result, 144, 48, 96, 0, 0, 40);
}

TEST(StepSimulatorTest, OptimizerStateIsCreatedInStep1AndPersists) {
  const SimRun run = simulate(Sharding::kZero2);
  auto optimizer_at = [&](const std::string& label) {
    for (size_t i = 0; i < run.result.timeline.size(); ++i) {
      if (run.result.timeline[i].label == label) return run.result.timeline_category_bytes[i][kOptimizer];
    }
    ADD_FAILURE() << label;
    return int64_t{-1};
  };
  EXPECT_EQ(optimizer_at("step1/backward/root"), 0);
  EXPECT_EQ(optimizer_at("step1/optimizer"), 96);
  EXPECT_EQ(optimizer_at("step2/forward/l0"), 96);
  EXPECT_EQ(optimizer_at("step2/optimizer"), 96);
  // One point after init, each unit's forward and backward, each optimizer.
  const std::vector<std::string> labels = {"init",
                                           "step1/forward/l0",
                                           "step1/forward/l1",
                                           "step1/forward/root",
                                           "step1/backward/l1",
                                           "step1/backward/l0",
                                           "step1/backward/root",
                                           "step1/optimizer",
                                           "step2/forward/l0",
                                           "step2/forward/l1",
                                           "step2/forward/root",
                                           "step2/backward/l1",
                                           "step2/backward/l0",
                                           "step2/backward/root",
                                           "step2/optimizer"};
  ASSERT_EQ(run.result.timeline.size(), labels.size());
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(run.result.timeline[i].label, labels[i]);
}

TEST(StepSimulatorTest, TimelineRecordsEachPhasesPeak) {
  // zero2, step 1: l0's forward peaks at its temporary T (30) before freeing
  // it: 48 + root 40 + l0 32 + A16 + B20 + T30 = 186, then ends at 156. The
  // optimizer peaks updating the last unit, l1: its state is the last of the
  // 192 the step ends with, and its denominator (12) comes on top.
  const SimRun run = simulate(Sharding::kZero2);
  const TimelinePoint& l0 = run.result.timeline[1];
  ASSERT_EQ(l0.label, "step1/forward/l0");
  EXPECT_EQ(l0.allocated_bytes, 156);
  EXPECT_EQ(l0.peak_allocated_bytes, 186);
  const TimelinePoint& optimizer = run.result.timeline[7];
  ASSERT_EQ(optimizer.label, "step1/optimizer");
  EXPECT_EQ(optimizer.peak_allocated_bytes, 192 + 12);
  for (const TimelinePoint& p : run.result.timeline) {
    EXPECT_GE(p.peak_allocated_bytes, p.allocated_bytes) << p.label;
    EXPECT_LE(p.peak_allocated_bytes, run.result.peak_allocated_bytes) << p.label;
  }
}

TEST(StepSimulatorTest, ShardingOrdersPeaksWhenStatesDominate) {
  // 8 blocks of 100k params, 4-byte activations, world 8: more sharding never
  // needs more memory. (At world 2 with 3 units zero2 can exceed zero1: it
  // holds its shards on top of gathered params that add up to zero1's.)
  const ModelTrace trace = blocks_trace(8, 100'000, /*allocs_per_block=*/2, /*bytes=*/4);
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  const StepSimulator sim(trace, units);
  ExactAllocator exact;
  auto peak = [&](Sharding sharding, bool offload = false) {
    Strategy s;
    s.sharding = sharding;
    s.offload = offload;
    s.world_size = s.shard_group_size = 8;
    return sim.simulate(s, exact).peak_allocated_bytes;
  };
  const int64_t ddp = peak(Sharding::kDdp), zero1 = peak(Sharding::kZero1);
  const int64_t zero2 = peak(Sharding::kZero2), zero3 = peak(Sharding::kZero3);
  EXPECT_GT(ddp, zero1);
  EXPECT_GE(zero1, zero2);
  EXPECT_GT(zero2, zero3);
  // ddp holds 16 bytes per param (params, grads, AdamW x2) of 801k.
  EXPECT_GE(ddp, 16 * 801'000);
  EXPECT_LT(peak(Sharding::kZero3, /*offload=*/true), zero3);
}

TEST(StepSimulatorTest, CudaModelReservesAtLeastWhatItAllocates) {
  const ModelTrace trace = two_block_trace(DType::kF32, /*act_scale=*/100000);
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  Strategy s;
  s.sharding = Sharding::kZero3;
  s.world_size = s.shard_group_size = 2;
  CudaCachingAllocatorModel cuda;
  SimOptions options;
  options.overhead_bytes = {3 << 20};
  const StepSimResult r = StepSimulator(trace, units).simulate(s, cuda, options);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_allocated_bytes);
  EXPECT_EQ(r.peak_breakdown_bytes[static_cast<int>(Category::kOverhead)], 3 << 20);
  for (const TimelinePoint& p : r.timeline)
    EXPECT_GE(p.reserved_bytes, p.allocated_bytes) << p.label;
  // Every charge is a multiple of 512 B.
  EXPECT_EQ(r.peak_allocated_bytes % 512, 0);
  ExactAllocator exact;
  EXPECT_GE(r.peak_allocated_bytes,
            StepSimulator(trace, units).simulate(s, exact, options).peak_allocated_bytes);
}

TEST(StepSimulatorTest, OomIsReportedWithItsPhase) {
  // zero3 fp32 reaches 260 before G1 in step 1's l1 backward; G1 (60) takes
  // it to 320 > 300.
  SimRun run = simulate(Sharding::kZero3, DType::kF32, false, true, 1, /*budget=*/300);
  EXPECT_TRUE(run.result.oom);
  EXPECT_EQ(run.result.oom_label, "step1/backward/l1");
  EXPECT_EQ(run.result.oom_category, Category::kActivations);
  EXPECT_EQ(run.result.oom_request_bytes, 60);
  EXPECT_EQ(run.result.peak_allocated_bytes, 260);
  // Under 250, l1's unsharded grad (24) is the allocation that fails: 236 + 24.
  run = simulate(Sharding::kZero3, DType::kF32, false, true, 1, /*budget=*/250);
  EXPECT_TRUE(run.result.oom);
  EXPECT_EQ(run.result.oom_label, "step1/backward/l1");
  EXPECT_EQ(run.result.oom_category, Category::kGrads);
  EXPECT_EQ(run.result.oom_request_bytes, 24);
}

TEST(StepSimulatorTest, RejectsImpossibleStrategies) {
  const ModelTrace trace = two_block_trace();
  const StepSimulator sim(trace, wrap_modules(trace.modules, WrapPolicy::parse("block")));
  ExactAllocator a;
  Strategy s;
  s.offload = true;  // ddp+offload
  EXPECT_THROW(sim.simulate(s, a), std::invalid_argument);
  s = Strategy{};
  s.sharding = Sharding::kZero3;
  s.world_size = 4;
  s.shard_group_size = 2;  // zero3 shards over the whole world
  EXPECT_THROW(sim.simulate(s, a), std::invalid_argument);
  s.sharding = Sharding::kHybrid;
  EXPECT_NO_THROW(sim.simulate(s, a));
  s.world_size = 3;
  EXPECT_THROW(sim.simulate(s, a), std::invalid_argument);
  s = Strategy{};
  s.compute_dtype = DType::kBF16;  // the trace is fp32
  EXPECT_THROW(sim.simulate(s, a), std::invalid_argument);
}

TEST(StepSimulatorTest, RejectsMalformedTraces) {
  ModelTrace trace = two_block_trace();
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  trace.events.push_back(trace.events.back());
  trace.events.back().kind = MemEvent::kFree;
  trace.events.back().tensor = 12345;  // never allocated
  EXPECT_THROW(StepSimulator(trace, units), std::invalid_argument);
}

TEST(StepSimulatorTest, RecomputeRunsInsideBackwardWithParamsGathered) {
  // l1 checkpointed: its forward keeps nothing (C is freed at once); its
  // backward re-runs the forward (C again) before G1.
  ModelTrace trace = two_block_trace();
  auto& ev = trace.events;
  // Forward: free C right after it is allocated (index of C's alloc + 1).
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].kind == MemEvent::kAlloc && ev[i].tensor == 103) {
      MemEvent free_c = ev[i];
      free_c.kind = MemEvent::kFree;
      ev.insert(ev.begin() + i + 1, free_c);
      break;
    }
  }
  // Backward: after l1's backward begins, recompute l1 and make C again.
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].kind == MemEvent::kModuleBegin && ev[i].module == 2 &&
        ev[i].phase == Phase::kBackward) {
      MemEvent rb = ev[i], alloc_c = ev[i], re = ev[i];
      rb.phase = re.phase = alloc_c.phase = Phase::kRecompute;
      re.kind = MemEvent::kModuleEnd;
      alloc_c.kind = MemEvent::kAlloc;
      alloc_c.tensor = 107;
      alloc_c.bytes = 12;
      ev.insert(ev.begin() + i + 1, {rb, alloc_c, re});
      break;
    }
  }
  for (auto& e : ev) {
    if (e.kind == MemEvent::kFree && e.tensor == 103 && e.phase == Phase::kBackward) e.tensor = 107;
  }
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  Strategy s;
  s.sharding = Sharding::kZero3;
  s.world_size = s.shard_group_size = 2;
  ExactAllocator a;
  const StepSimResult r = StepSimulator(trace, units).simulate(s, a);
  // Same live set at G1 as without checkpointing (C recomputed): 416.
  EXPECT_EQ(r.peak_allocated_bytes, 416);
  EXPECT_EQ(r.peak_allocated_label, "step2/backward/l1");
}

// ---- gradient accumulation (Strategy::grad_accum) ----

SimRun simulate_accum(Sharding sharding, int grad_accum, DType dtype = DType::kF32,
                      bool offload = false) {
  const ModelTrace trace = two_block_trace(dtype);
  const UnitPartition units = wrap_modules(trace.modules, WrapPolicy::parse("block"));
  Strategy s;
  s.sharding = sharding;
  s.offload = offload;
  s.compute_dtype = dtype;
  s.world_size = s.shard_group_size = 2;
  s.grad_accum = grad_accum;
  ExactAllocator allocator;
  return SimRun{StepSimulator(trace, units).simulate(s, allocator)};
}

TEST(StepSimulatorTest, GradAccumOneIsTheDefault) {
  for (Sharding sharding : {Sharding::kDdp, Sharding::kZero1, Sharding::kZero2, Sharding::kZero3}) {
    const SimRun plain = simulate(sharding), accum1 = simulate_accum(sharding, 1);
    EXPECT_EQ(accum1.result.peak_allocated_bytes, plain.result.peak_allocated_bytes);
    EXPECT_EQ(accum1.result.timeline.size(), plain.result.timeline.size());
  }
}

TEST(StepSimulatorTest, GradAccumZero2KeepsShardGradsThroughTheNextMicroBatch) {
  // Micro-batch 1 of each step is a step without accumulation. In micro-batch
  // 2 every unit's fp32 shard grad (20 + 16 + 12 = 48) is live from the
  // start; the reduce-scatter then adds into them (fp32: from the unsharded
  // grad's own slot), allocating nothing. Step 2, micro-batch 2, at G1:
  // 416 + 48 = 464.
  const SimRun run = simulate_accum(Sharding::kZero2, 2);
  EXPECT_EQ(run.result.peak_allocated_bytes, 464);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 144, 64 + 48, 96, 112);
  // Each micro-batch marks its labels: init + 2 x (2 x 6 + optimizer).
  ASSERT_EQ(run.result.timeline.size(), 27u);
  const std::vector<std::string> step1 = {
      "step1/forward/l0",   "step1/forward/l1",  "step1/forward/root", "step1/backward/l1",
      "step1/backward/l0",  "step1/backward/root", "step1/forward/l0", "step1/forward/l1",
      "step1/forward/root", "step1/backward/l1", "step1/backward/l0",  "step1/backward/root",
      "step1/optimizer"};
  for (size_t i = 0; i < step1.size(); ++i) EXPECT_EQ(run.result.timeline[1 + i].label, step1[i]);
  // After l0's forward: 156 in micro-batch 1, + the 48 of shard grads in 2.
  EXPECT_EQ(run.result.timeline[1].allocated_bytes, 156);
  EXPECT_EQ(run.result.timeline[7].allocated_bytes, 156 + 48);
  // A micro-batch ends where it began, but for the loss's 4 bytes: the
  // shard grads are not allocated again.
  EXPECT_EQ(run.result.timeline[6].allocated_bytes, 100);
  EXPECT_EQ(run.result.timeline[12].allocated_bytes, 100);
  EXPECT_EQ(run.at("step1/optimizer"), 96 + 96);
}

TEST(StepSimulatorTest, GradAccumThreeCostsWhatTwoDoes) {
  // The shard grads are the only state carried between micro-batches, and
  // they are whole after the first: a third micro-batch repeats the second.
  const SimRun two = simulate_accum(Sharding::kZero3, 2), three = simulate_accum(Sharding::kZero3, 3);
  EXPECT_EQ(three.result.peak_allocated_bytes, two.result.peak_allocated_bytes);
  EXPECT_EQ(three.result.timeline.size(), 1u + 2 * (3 * 6 + 1));
}

TEST(StepSimulatorTest, GradAccumMixedReduceScattersEveryMicroBatch) {
  // bf16 zero3. Micro-batch 2 of step 2 at G1: shards 48 + gathered root 20,
  // l1 12 and prefetched l0 16; unsharded grads root 20 + l1 12 and every
  // fp32 shard grad 48; AdamW 96; activations 112: 384. (Without
  // accumulation the peak is 342, at l1's post-backward.) The 2-byte
  // reduce-scatter output is allocated on every micro-batch, and freed once
  // added into the fp32 shard grad: at the end of each micro-batch the same
  // bytes are live.
  const SimRun run = simulate_accum(Sharding::kZero3, 2, DType::kBF16);
  EXPECT_EQ(run.result.peak_allocated_bytes, 384);
  EXPECT_EQ(run.result.peak_allocated_label, "step2/backward/l1");
  expect_breakdown(run.result, 96, 80, 96, 112);
  EXPECT_EQ(run.result.timeline[6].label, "step1/backward/root");
  EXPECT_EQ(run.result.timeline[12].label, "step1/backward/root");
  EXPECT_EQ(run.result.timeline[12].allocated_bytes, run.result.timeline[6].allocated_bytes);
}

TEST(StepSimulatorTest, GradAccumLeavesDdpAndOffloadedShardGradsAlone) {
  // ddp/zero1 accumulate into the flat grad they keep anyway; offloaded
  // shard grads accumulate on the host. Neither device peak moves, and the
  // host holds one shard grad per unit, not one per micro-batch.
  for (Sharding sharding : {Sharding::kDdp, Sharding::kZero1}) {
    EXPECT_EQ(simulate_accum(sharding, 3).result.peak_allocated_bytes,
              simulate(sharding).result.peak_allocated_bytes);
  }
  const SimRun offload = simulate_accum(Sharding::kZero3, 3, DType::kF32, /*offload=*/true);
  EXPECT_EQ(offload.result.peak_allocated_bytes, 272);
  EXPECT_EQ(offload.result.peak_host_bytes, 192);
}

TEST(StepSimulatorTest, GradAccumBelowOneIsRejected) {
  const ModelTrace trace = two_block_trace();
  const StepSimulator sim(trace, wrap_modules(trace.modules, WrapPolicy::parse("block")));
  ExactAllocator a;
  Strategy s;
  s.grad_accum = 0;
  EXPECT_THROW(sim.simulate(s, a), std::invalid_argument);
}

// A GPT-2-sized event count: 48 blocks, ~1,000 events each. Not a benchmark,
// a guard against accidental quadratic work in simulate().
// A GPT-2 XL-sized trace (48 blocks, 4096 events each) replays under the
// caching-allocator model without a timeline. How fast is plan_bench's
// question (Google Benchmark); a wall-clock bound here failed on loaded VMs.
TEST(StepSimulatorTest, LargeTraceSimulatesWithoutTimeline) {
  const ModelTrace t = blocks_trace(48, 7'000'000, 500, 4096);
  const UnitPartition units = wrap_modules(t.modules, WrapPolicy::parse("block"));
  const StepSimulator sim(t, units);
  Strategy s;
  s.sharding = Sharding::kZero3;
  s.world_size = s.shard_group_size = 8;
  CudaCachingAllocatorModel cuda;
  const auto start = std::chrono::steady_clock::now();
  const StepSimResult r = sim.simulate(s, cuda, SimOptions{{}, false});
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(r.oom);
  EXPECT_TRUE(r.timeline.empty());
  EXPECT_GT(r.peak_allocated_bytes, 0);
  RecordProperty("simulate_us", static_cast<int>(run_s * 1e6));  // informational only
}

}  // namespace
}  // namespace shardfit::planner
