// PyTorch FSDP on --stack pytorch (planner/pytorch_fsdp.h), replayed on a
// hand-made two-unit model through the exact allocator, so that every figure
// below can be added up by hand:
//   root  (module 0): owns "ln" (4 elements)           -> the root unit
//   lin   (module 1): owns "w" (10) and "b" (2)        -> its own unit (min 10)
// On 2 ranks: lin's shard is 6 elements (24 B), padded unsharded 12 (48 B);
// the root's shard 2 (8 B), unsharded 4 (16 B).
#include "planner/pytorch_fsdp.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "fsdp_test_trace.h"

namespace shardfit::planner {
namespace {

using fsdp_test::adamw;
using fsdp_test::at;
using fsdp_test::ev;
using fsdp_test::step;

std::vector<ModuleNode> modules() {
  std::vector<ModuleNode> m(2);
  m[0].type = "Net";
  m[0].children = {1};
  m[0].params = {ParamInfo{"ln", {4}, 4}};
  m[1].path = "lin";
  m[1].type = "Linear";
  m[1].parent = 0;
  m[1].params = {ParamInfo{"lin.w", {10}, 10}, ParamInfo{"lin.b", {2}, 2}};
  return m;
}

struct Fixture {
  ModelTrace trace = step();
  std::vector<ModelTrace> per_param = {adamw(true), adamw(false), adamw(true),
                                       adamw(false), adamw(true), adamw(false)};
  PytorchDdpInputs in;
  Fixture() {
    in.no_grads = &trace;
    in.param_numels = {10, 2, 4};
    in.optimizer_param_steps = &per_param;
  }
  StepSimResult run(PytorchFsdpOptions o, int world = 2) {
    if (o.wrap.kind == spec::WrapPolicy::Kind::kSize) o.wrap.min_num_params = 10;
    o.world_size = world;
    o.backward_prefetch = PytorchFsdpOptions::Prefetch::kNone;
    ExactAllocator a;
    std::vector<ModuleNode> m = modules();
    m[1].is_block = true;  // what transformer_auto_wrap_policy wraps here
    return simulate_pytorch_fsdp(in, m, o, a);
  }
};

TEST(PytorchFsdp, FullShardGathersEachUnitForItsForwardAndBackwardOnly) {
  Fixture f;
  PytorchFsdpOptions o;
  o.zero_grad_set_to_none = false;  // 1.x's zero_grad: the reduced shards stay
  const StepSimResult r = f.run(o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 8 + 24);  // the two shards
  // Forward: the root gathered (16) and kept, lin gathered (48) for its
  // forward only: 32 + 16 + 100 + 48 + 40 at lin's highest, 196 after it.
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, 236);
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 196);
  // Backward: lin gathered again (48), its gradients (48), then the flat
  // gradient (48) before they go: 188 + 48 + 48 + 48 = 332 - 40 (its
  // activation freed first) = 292. After: each rank's shards and reduced
  // gradient shards, 32 + 32.
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 292);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 64);
  // AdamW's exp_avg and exp_avg_sq per shard: 2 x 32.
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 128);
  EXPECT_EQ(at(r, "step2/backward").allocated_bytes, 128);
}

// transformer_auto_wrap_policy({Linear}) makes the same two units as
// min_num_params=10 here: the same step, byte for byte.
TEST(PytorchFsdp, TransformerWrapPolicyWrapsEachBlock) {
  Fixture f;
  PytorchFsdpOptions by_size, by_block;
  by_block.wrap = spec::WrapPolicy::parse("block");
  const StepSimResult a = f.run(by_size), b = f.run(by_block);
  ASSERT_EQ(a.timeline.size(), b.timeline.size());
  for (size_t i = 0; i < a.timeline.size(); ++i) {
    EXPECT_EQ(a.timeline[i].allocated_bytes, b.timeline[i].allocated_bytes) << a.timeline[i].label;
    EXPECT_EQ(a.timeline[i].peak_allocated_bytes, b.timeline[i].peak_allocated_bytes) << a.timeline[i].label;
  }
  PytorchFsdpOptions none;
  none.wrap = spec::WrapPolicy::parse("none");
  EXPECT_THROW(f.run(none), std::invalid_argument);
}

TEST(PytorchFsdp, ShardGradOpKeepsTheGatheredUnitFromForwardToBackward) {
  Fixture f;
  PytorchFsdpOptions o;
  o.reshard_after_forward = false;
  const StepSimResult r = f.run(o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 196 + 48);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 64);
}

TEST(PytorchFsdp, OffloadLeavesNothingOnTheGpuBetweenSteps) {
  Fixture f;
  PytorchFsdpOptions o;
  o.offload_params = true;
  const StepSimResult r = f.run(o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 0);
  // The root's shard copied up (8) and gathered (16), the copy dropped;
  // lin's gathered and freed again; the activations (100, 40, 8).
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 16 + 100 + 40 + 8);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 0);
  EXPECT_EQ(at(r, "step2/optimizer").allocated_bytes, 0);
}

// One rank runs as NO_SHARD: each unit's flat parameter whole (root 16 B,
// lin 48 B), never gathered; the flat gradient kept as .grad.
TEST(PytorchFsdp, OneRankRunsAsNoShard) {
  Fixture f;
  PytorchFsdpOptions o;
  StepSimResult r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 64);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 64 + 64);        // + the flat gradients
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 64 + 64 + 128);  // + exp_avg, exp_avg_sq
  // With offload_params the parameters live on the host; each unit's copy
  // made for its forward stays (the module's views hold it) until its next
  // forward's: after backward, 64 B of copies, the gradients gone to the host.
  o.offload_params = true;
  r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 0);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 64);
  EXPECT_EQ(at(r, "step2/optimizer").allocated_bytes, 64);
}

// NO_SHARD on 8 ranks: each unit's flat parameter whole and unpadded, as
// on one rank (sharded, root and lin would pad to 8 and 16 elements), so
// every timeline point holds what one rank's does. On CPU ranks each unit's
// gradient is divided by 4 before Gloo's in-place all-reduce and by 2 after
// (_get_gradient_predivide_factor(8)): each division a 0-dim double and its
// fp32 cast, 12 bytes come and gone once the parameters' gradients are, so
// under backward's peak (lin's gradients and its flat one, both live).
TEST(PytorchFsdp, NoShardKeepsWholeUnitsOnEveryRank) {
  Fixture f;
  PytorchFsdpOptions o;
  o.cpu = true;
  const StepSimResult one = f.run(o, 1);
  o.no_shard = true;
  const StepSimResult eight = f.run(o, 8);
  ASSERT_FALSE(eight.oom);
  ASSERT_EQ(one.timeline.size(), eight.timeline.size());
  for (size_t i = 0; i < one.timeline.size(); ++i) {
    EXPECT_EQ(one.timeline[i].allocated_bytes, eight.timeline[i].allocated_bytes) << one.timeline[i].label;
    EXPECT_EQ(one.timeline[i].peak_allocated_bytes, eight.timeline[i].peak_allocated_bytes) << one.timeline[i].label;
  }
  EXPECT_EQ(at(eight, "init").allocated_bytes, 64);
  // The sharded strategies pad: FULL_SHARD's shards on 8 ranks are 1 and 2 elements.
  o.no_shard = false;
  EXPECT_EQ(at(f.run(o, 8), "init").allocated_bytes, 4 + 8);
}

// use_orig_params=True: AdamW steps each parameter's part of the rank's
// shard. On 2 ranks the root's shard is ln[0:2] or ln[2:4], lin's is
// w[0:6] on rank 0 and w[6:10] + b on rank 1, in parameters() order (ln,
// lin.w, lin.b; 0 where a parameter has no part). Rank 0 steps 2 and 6
// elements, as its flat shards; rank 1 steps 2, 4 and 2: the same state
// (64 B), but its step's highest point (the state, w's denominator carried
// into b's update and b's two temporaries: 64 + 16 + 16) is 16 B under rank
// 0's (64, the root's denominator 8, lin's temporaries 48).
TEST(PytorchFsdp, UseOrigParamsStepsEachParametersPartOfTheShard) {
  const std::vector<ModuleNode> m = modules();
  const spec::UnitPartition part = spec::wrap_modules(m, spec::WrapPolicy::parse("size:10"),
                                                      spec::TiedParams::kCopiedPerUnit);
  EXPECT_EQ(fsdp1_optimized_shards(m, part, 2, 0, false, false), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(fsdp1_optimized_shards(m, part, 2, 0, false, true), (std::vector<int64_t>{2, 6, 0}));
  EXPECT_EQ(fsdp1_optimized_shards(m, part, 2, 1, false, true), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(fsdp1_optimized_shards(m, part, 2, 1, true, true), (std::vector<int64_t>{4, 10, 2}));  // NO_SHARD

  Fixture f;
  PytorchFsdpOptions o;
  const StepSimResult flat = f.run(o);
  o.use_orig_params = true;
  const StepSimResult rank0 = f.run(o);
  o.rank = 1;
  const StepSimResult rank1 = f.run(o);
  ASSERT_FALSE(rank1.oom);
  EXPECT_EQ(at(rank0, "step1/optimizer").peak_allocated_bytes, at(flat, "step1/optimizer").peak_allocated_bytes);
  EXPECT_EQ(at(rank1, "step1/optimizer").allocated_bytes, at(flat, "step1/optimizer").allocated_bytes);
  EXPECT_EQ(at(rank1, "step1/optimizer").peak_allocated_bytes,
            at(flat, "step1/optimizer").peak_allocated_bytes - 16);
}

// BackwardPrefetch on three units (the root, then two Linears of 12
// elements run in that order: each a 24 B shard, 48 B gathered). In
// backward lin2 runs first; BACKWARD_PRE gathers lin1 as lin2's backward
// starts (its 48 B live through lin2's gradients), BACKWARD_POST once lin2's
// gradient is flat, none only at lin1's own pre-backward hook.
TEST(PytorchFsdp, BackwardPrefetchGathersTheNextUnitEarly) {
  // Forward: 100 B in the root, 40 B in each Linear, an 8 B loss; backward:
  // each Linear's two gradients (40 B, 8 B), the root's (16 B).
  const fsdp_test::TwoBlockInputs inputs({10, 2, 10, 2, 4});
  const PytorchDdpInputs& in = inputs.in;
  const std::vector<ModuleNode> m = fsdp_test::two_block_modules();
  auto backward_peak = [&](PytorchFsdpOptions::Prefetch prefetch) {
    PytorchFsdpOptions o;
    o.wrap.min_num_params = 10;
    o.backward_prefetch = prefetch;
    ExactAllocator a;
    const StepSimResult r = simulate_pytorch_fsdp(in, m, o, a);
    EXPECT_FALSE(r.oom);
    return at(r, "step1/backward").peak_allocated_bytes;
  };
  // Forward leaves the 56 B of shards, the root's 16 B gathered, 100 + 40 +
  // 40 B of activations: 252 B once the loss is freed.
  // none: lin2 gathered (300), its gradients (348), its activation freed
  // (308), its flat gradient (356); the gradients and lin2 go (260), its
  // padded gradient and reduced shard come and the padding goes (284, the
  // flat gradient in flight). lin1 gathered (332), its gradients (380), its
  // activation freed (340), its flat gradient (388): the peak.
  EXPECT_EQ(backward_peak(PytorchFsdpOptions::Prefetch::kNone), 388);
  // BACKWARD_PRE: lin1's 48 B from lin2's pre-backward on: 356 + 48 = 404.
  EXPECT_EQ(backward_peak(PytorchFsdpOptions::Prefetch::kBackwardPre), 404);
  // BACKWARD_POST: lin1 gathered in lin2's post-backward hook once lin2 is
  // resharded (260 + 48), under its padded gradient and shard (380): lin1's
  // own flat gradient is the peak again, 388.
  EXPECT_EQ(backward_peak(PytorchFsdpOptions::Prefetch::kBackwardPost), 388);
}

// MixedPrecision(param_dtype = reduce_dtype = buffer_dtype = bf16), FULL_SHARD
// on 2 ranks, over the model's bf16 trace (its gradients 2 B an element),
// with a float32 buffer of 5 elements (20 B) and a uint8 one (3 B); zero_grad
// keeps the gradients.
struct MixedFixture : Fixture {
  PytorchFsdpOptions o;
  MixedFixture() {
    trace = step(2);
    in.buffers = {BufferInfo{"mask", {5}, "float32", 20}, BufferInfo{"idx", {3}, "uint8", 3}};
    o.zero_grad_set_to_none = false;
    o.mixed_precision = DType::kBF16;
  }
};

TEST(PytorchFsdp, MixedPrecisionGathersAndReducesInBf16AndKeepsFp32Shards) {
  MixedFixture f;
  PytorchFsdpOptions& o = f.o;
  StepSimResult r = f.run(o);
  ASSERT_FALSE(r.oom);
  // The fp32 shards (8 + 24) and both buffers.
  EXPECT_EQ(at(r, "init").allocated_bytes, 32 + 23);
  // Forward: the float buffer cast to bf16 (10, the 20 B one dropped: 45);
  // each unit's bf16 shard made, gathered into bf16 and dropped: the root
  // 4 + 8 (57), kept; 100 B (153); lin 12 + 24 (189, then 177); 40 B (217,
  // the peak); lin freed (193); the loss (201).
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, 217);
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 201);
  // Backward: the loss goes (193); lin's bf16 shard and gathered flat (12 +
  // 24, 217 once the shard is dropped), its bf16 gradients 20 + 4: 241, the
  // peak. Each unit's flat gradient, padded copy and reduced shard are
  // bf16, the shard then cast to fp32; left: the fp32 shards (32), the
  // buffers (13) and the fp32 reduced gradient shards (24 + 8).
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 241);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 32 + 13 + 32);
  // AdamW over the fp32 shards: exp_avg and exp_avg_sq, 2 x 32.
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 77 + 64);
  EXPECT_EQ(at(r, "step2/backward").allocated_bytes, 141);
  // With offload_params: each unit's fp32 shard copied up (the root's 8,
  // lin's 24) only to be cast into the bf16 one, and dropped with it.
  o.offload_params = true;
  r = f.run(o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 23);
  // 13 of buffers, the root's 8 gathered, 148 of activations; lin's peak
  // (its bf16 shard, the fp32 copy, then gathered 24 once the copy is gone)
  // 185 with its activation.
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 13 + 8 + 148);
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, 185);
}

// One rank (NO_SHARD) with MixedPrecision: each unit's whole flat parameter
// stays fp32 (root 16, lin 48); its bf16 copy (_mp_shard: 8, 24) is made by
// each pre-unshard and freed by each reshard, after the unit's forward and
// after its backward. The bf16 flat gradient is cast to fp32 and kept.
TEST(PytorchFsdp, MixedPrecisionOnOneRankCopiesEachWholeUnitToBf16AroundItsPasses) {
  MixedFixture f;
  PytorchFsdpOptions& o = f.o;
  StepSimResult r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 64 + 23);
  // The float buffer cast (77); the root's copy (85), 100 B (185); lin's
  // copy (209) and 40 B (249, the peak), its copy freed (225); the loss
  // (233); the root's copy freed: 225.
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, 249);
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 225);
  // Backward: the root's copy again (233), the loss freed (225), lin's copy
  // (249) and its bf16 gradients 20 + 4: 273, the peak. Lin's flat gradient
  // (24) replaces them, its copy goes (209), the gradient cast to fp32 (48)
  // and the bf16 one dropped: 233; the root's likewise. Left: the fp32
  // parameters (64), the buffers (13), the fp32 gradients (64).
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 273);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 141);
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 141 + 128);
  // Step 2 from 269, the fp32 .grad kept (zero_grad(set_to_none=False)):
  // the forward leaves 148 B (417); the root's copy (425), the loss freed,
  // lin's copy and gradients: 465, the peak. Lin's new bf16 flat gradient is
  // added into the kept one and dropped; reduce_dtype bf16 casts that down
  // (24) and back up (48) before the old one goes (449 at most): the same
  // 269 after backward.
  EXPECT_EQ(at(r, "step2/backward").peak_allocated_bytes, 465);
  EXPECT_EQ(at(r, "step2/backward").allocated_bytes, 269);
  // keep_low_precision_grads: the gradients stay bf16 (24 + 8), not cast.
  o.keep_low_precision_grads = true;
  r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 77 + 32);
  EXPECT_EQ(at(r, "step2/backward").allocated_bytes, 77 + 32 + 128);
  // offload_params: only the buffers stay on the GPU; each pre-unshard also
  // copies the unit's fp32 parameter up (16, 48) and drops it once cast:
  // lin's 24 + 48 over 121 B is the forward's top, 193.
  o.keep_low_precision_grads = false;
  o.offload_params = true;
  r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "init").allocated_bytes, 23);
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, 193);
  EXPECT_EQ(at(r, "step1/forward").allocated_bytes, 13 + 148);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 13);
}

// MixedPrecision(param_dtype=bf16, reduce_dtype=float32): each unit's bf16
// flat gradient cast to fp32 before the reduce-scatter, padded and reduced
// in fp32. keep_low_precision_grads: the reduced shards cast to bf16 for
// the optimizer.
TEST(PytorchFsdp, ReduceDtypeAndLowPrecisionGradsChangeTheGradientsDtype) {
  MixedFixture f;
  PytorchFsdpOptions& o = f.o;
  o.reduce_dtype = DType::kF32;
  StepSimResult r = f.run(o);
  ASSERT_FALSE(r.oom);
  // Lin's hook (MixedPrecisionGathersAndReduces...'s backward, there at
  // 177 once lin is resharded): its flat gradient in fp32 (48: 225), padded
  // in fp32 (48: 273), reduced into an fp32 shard (24): 297, the peak; no
  // cast after. The backward ends as with bf16 reductions: fp32 shards.
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 297);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 32 + 13 + 32);
  o.reduce_dtype.reset();
  o.keep_low_precision_grads = true;
  r = f.run(o);
  ASSERT_FALSE(r.oom);
  // The reduced shards cast to bf16 at the backward's end (the root's 8 to
  // 4, lin's 24 to 12): 32 + 13 + 16; the peak as with fp32 grads (241).
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 241);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 61);
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 61 + 64);
  // Step 2: the kept bf16 .grad takes the new shards; nothing cast again.
  EXPECT_EQ(at(r, "step2/backward").allocated_bytes, 125);
}

// MixedPrecision(reduce_dtype=torch.bfloat16) alone, beside fp32
// parameters: computed in fp32, each flat gradient cast to bf16 for its
// reduction and what was reduced cast back to fp32. On one rank (NO_SHARD)
// that cast is the backward's peak.
TEST(PytorchFsdp, ReduceDtypeBf16BesideFp32ParametersCastsEachFlatGradient) {
  Fixture f;
  PytorchFsdpOptions o;
  StepSimResult r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  // Reduced in fp32: lin's flat gradient (48) over the 212 B its own
  // gradients leave is the top, 260.
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 260);
  o.reduce_dtype = DType::kBF16;
  r = f.run(o, 1);
  ASSERT_FALSE(r.oom);
  // In bf16: beside the flat gradient (212 once lin's own gradients go),
  // its bf16 copy (24) and the fp32 one made from it (48): 284, the copy
  // dropped, then the original. The same fp32 parameters and gradients
  // left (64 + 64).
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, 284);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 128);
  // Two ranks: the reduced shards end fp32 as when reduced in fp32; the
  // peak is lin's flat gradient beside its gradients either way (292).
  const StepSimResult fp32 = f.run(PytorchFsdpOptions{}), bf16 = f.run(o);
  ASSERT_FALSE(bf16.oom);
  EXPECT_EQ(at(bf16, "step1/backward").allocated_bytes, at(fp32, "step1/backward").allocated_bytes);
  EXPECT_EQ(at(bf16, "step1/backward").peak_allocated_bytes, 292);
}

// MixedPrecision(param_dtype=torch.float16) with ShardedGradScaler: fp16 is
// bf16's size, so every figure is MixedPrecisionGathersAndReduces...'s but
// the scaler's: its scale and growth tracker (4 + 4) from step 1's backward
// on, and unscale_'s tensors around the optimizer step (8 + 8, then 4, 4, 4,
// 4, the last kept until update()).
TEST(PytorchFsdp, Fp16MixedPrecisionAddsTheShardedGradScalersTensors) {
  MixedFixture f;
  f.o.mixed_precision = DType::kF16;
  const StepSimResult bf16 = [&] {
    MixedFixture g;
    return g.run(g.o);
  }();
  f.o.grad_scaler = true;
  const StepSimResult r = f.run(f.o);
  ASSERT_FALSE(r.oom);
  EXPECT_EQ(at(r, "step1/forward").peak_allocated_bytes, at(bf16, "step1/forward").peak_allocated_bytes);
  EXPECT_EQ(at(r, "step1/backward").peak_allocated_bytes, at(bf16, "step1/backward").peak_allocated_bytes + 8);
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 77 + 8);
  // Unscale at 85: 8, 8 (101), the first freed, 4 (97), the second freed,
  // 4, 4, 4 (101); three freed (89, the found_inf copy kept); AdamW's state
  // (64): 153; update() frees the found_inf copy: 149.
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 77 + 8 + 64);
  EXPECT_EQ(at(r, "step2/optimizer").allocated_bytes, 77 + 8 + 64);
  // With offload_params the gradients are on the host, and so are
  // unscale_'s copies: on the GPU after backward only the cast buffers (13)
  // and the scaler's 8; unscale_ 8, 8 (37, the top), the first freed, 4, the
  // second freed, found_inf 4, its GPU copy for the all-reduce 4, all three
  // freed as unscale_ returns (21); AdamW on the host; update() brings the
  // host found_inf to the GPU (4) and drops it.
  f.o.offload_params = true;
  const StepSimResult h = f.run(f.o);
  ASSERT_FALSE(h.oom);
  EXPECT_EQ(at(h, "step1/backward").allocated_bytes, 13 + 8);
  EXPECT_EQ(at(h, "step1/optimizer").peak_allocated_bytes, 37);
  EXPECT_EQ(at(h, "step1/optimizer").allocated_bytes, 21);
}

// AdamW(foreach=True) on a GPU, over the three parameters (40, 8, 16 B), as
// 1.13 records it: every exp_avg and exp_avg_sq (the first step only),
// every sqrt, every denominator, all freed on return.
ModelTrace multi_tensor_adamw(bool first) {
  ModelTrace t;
  t.op_names = {"aten::empty_strided"};
  int64_t id = 0;
  auto alloc = [&](int64_t bytes) {
    t.events.push_back(ev(MemEvent::kAlloc, Phase::kForward, 0, ++id, bytes));
    t.events.back().op = 0;
  };
  for (int64_t p : {40, 8, 16})
    if (first) alloc(p), alloc(p);
  const int64_t kept = id;
  for (int k = 0; k < 2; ++k)
    for (int64_t p : {40, 8, 16}) alloc(p);
  for (int64_t x = id; x > kept; --x) t.events.push_back(ev(MemEvent::kFree, Phase::kForward, 0, x));
  return t;
}

TEST(PytorchFsdp, MultiTensorAdamwHoldsEveryShardsTemporariesAtOnce) {
  Fixture f;
  const MultiTensorAdamwStep first(multi_tensor_adamw(true), {40, 8, 16});
  const MultiTensorAdamwStep later(multi_tensor_adamw(false), {40, 8, 16});
  f.in.list_step_first = &first;
  f.in.list_step_later = &later;
  const StepSimResult r = f.run(PytorchFsdpOptions{});
  ASSERT_FALSE(r.oom);
  // After backward: the shards (8 + 24) and their reduced gradients (32).
  // The step over the two flat shards: their state (2 x 32), then the sqrt
  // and the denominator of both at once (2 x 32): 192 at the top, 128 left.
  EXPECT_EQ(at(r, "step1/backward").allocated_bytes, 64);
  EXPECT_EQ(at(r, "step1/optimizer").peak_allocated_bytes, 192);
  EXPECT_EQ(at(r, "step1/optimizer").allocated_bytes, 128);
  EXPECT_EQ(at(r, "step2/optimizer").peak_allocated_bytes, 192);
}

// forward_prefetch=True (`--prefetch 2`) on a root holding two Linears,
// lin1 and lin2 (each 12 elements: 48 B gathered, 24 B a shard), every unit
// FULL_SHARD: from step 2 on each unit's pre-forward gathers the next unit
// in the order step 1 recorded, so lin2 is gathered while lin1 computes.
StepSimResult three_units(bool forward_prefetch, PytorchFsdpOptions::Prefetch backward) {
  const fsdp_test::TwoBlockInputs inputs({10, 2, 10, 2, 4});
  const std::vector<ModuleNode> m = fsdp_test::two_block_modules();
  PytorchFsdpOptions o;
  o.wrap = spec::WrapPolicy{spec::WrapPolicy::Kind::kBlock, 0};
  o.world_size = 2;
  o.backward_prefetch = backward;
  o.forward_prefetch = forward_prefetch;
  ExactAllocator a;
  return simulate_pytorch_fsdp(inputs.in, m, o, a);
}

TEST(PytorchFsdp, ForwardPrefetchGathersTheNextUnitFromTheSecondStep) {
  for (auto backward : {PytorchFsdpOptions::Prefetch::kNone, PytorchFsdpOptions::Prefetch::kBackwardPre}) {
    const StepSimResult off = three_units(false, backward);
    const StepSimResult on = three_units(true, backward);
    ASSERT_FALSE(off.oom || on.oom);
    // Step 1 records the order: no forward prefetch yet. The shards (8 + 24
    // + 24), the root gathered (16) and its 100, lin1 gathered (48) and its
    // 40, lin1 resharded, lin2 gathered (48) and its 40: 300 at the top.
    EXPECT_EQ(at(off, "step1/forward").peak_allocated_bytes, 300);
    EXPECT_EQ(at(on, "step1/forward").peak_allocated_bytes, 300);
    // Step 2: lin2's 48 gathered at lin1's pre-forward, beside lin1's own
    // 48 and its 40: 8 B above the 244 over the step's start that lin2's
    // own gather reached.
    EXPECT_EQ(at(on, "step2/forward").peak_allocated_bytes - at(off, "step2/forward").peak_allocated_bytes, 8);
    // Resharding after forward forgets the prefetch, so backward prefetches
    // as it did.
    EXPECT_EQ(at(on, "step2/backward").peak_allocated_bytes, at(off, "step2/backward").peak_allocated_bytes);
    EXPECT_EQ(at(on, "step2/optimizer").allocated_bytes, at(off, "step2/optimizer").allocated_bytes);
  }
}

TEST(PytorchFsdp, ShardsArePaddedToTheFirstChunk) {
  EXPECT_EQ(fsdp_shard_numel(12, 2), 6);
  EXPECT_EQ(fsdp_shard_numel(13, 2), 7);
  EXPECT_EQ(fsdp_shard_numel(1, 4), 1);
}

}  // namespace
}  // namespace shardfit::planner

namespace shardfit::planner {
namespace {

// A tied weight wrapped into two units (size:5: "emb" and "head" alone):
// each unit flattens its own copy, so the owner's and the borrower's
// gradients are each their own unit's (SplitTieGrads); by block (one unit
// holding both) the tie is not split and nothing is.
TEST(PytorchFsdp, ATieSplitAcrossUnitsGivesEachItsOwnGradient) {
  std::vector<ModuleNode> m(3);
  m[0].type = "Net";
  m[0].children = {1, 2};
  m[1].path = "emb";
  m[1].type = "Embedding";
  m[1].parent = 0;
  m[1].params = {ParamInfo{"emb.w", {10}, 10}};
  m[2].path = "head";
  m[2].type = "Linear";
  m[2].parent = 0;
  m[2].borrowed_params = {"emb.w"};
  const spec::UnitPartition split =
      spec::wrap_modules(m, spec::WrapPolicy::parse("size:5"), spec::TiedParams::kCopiedPerUnit);
  ASSERT_EQ(split.units.size(), 3u);
  const SplitTieGrads ties = split_tie_grads(m, split, 4);
  ASSERT_EQ(ties.owner_bytes.size(), 1u);
  EXPECT_EQ(ties.owner_bytes.at(1), 40);
  ASSERT_EQ(ties.borrowers.size(), 1u);
  EXPECT_EQ(ties.borrowers.at(2).owner, 1);
  EXPECT_EQ(ties.borrowers.at(2).bytes, 40);
  const spec::UnitPartition together =
      spec::wrap_modules(m, spec::WrapPolicy::parse("size:100"), spec::TiedParams::kCopiedPerUnit);
  const SplitTieGrads none = split_tie_grads(m, together, 4);
  EXPECT_TRUE(none.owner_bytes.empty());
  EXPECT_TRUE(none.borrowers.empty());
}

}  // namespace
}  // namespace shardfit::planner
