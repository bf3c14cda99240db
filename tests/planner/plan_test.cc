// The planner end to end on real traces: the physics of the reference
// scenario, batch-affine traces, checkpoint sets, and the search's promise
// (max fits, max+1 does not) under both allocator models.
#include <gtest/gtest.h>

#include "planner/batch_search.h"
#include "planner/plan_builder.h"
#include "planner/trace.h"
#include "models/module_table.h"
#include "spec/recompute.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {
namespace {

DeviceProfile profile(const std::string& name) {
  return load_profile(name, SHARDFIT_SOURCE_DIR "/profiles");
}

Plan plan_for(const std::string& model, int gpus, const std::string& device,
              const std::vector<std::string>& strategies, int64_t seq = 128) {
  PlanRequest r;
  r.model = models::resolve_model(model);
  r.seq_len = seq;
  r.gpus_per_node = gpus;
  r.profile = profile(device);
  r.candidates.strategies = strategies;
  return build_plan(r);
}

int64_t max_batch(const Plan& p, const std::string& id) {
  const PlanCandidate* c = p.find(id);
  EXPECT_NE(c, nullptr) << id;
  return c ? c->max_batch_per_gpu : -1;
}

// The reference scenario (GPT-2 Large, seq 128, 2 x Titan RTX): more sharding
// never fits a smaller batch, offload and checkpointing never either, and
// mixed precision fits more than fp32.
TEST(PlanPhysics, ReferenceScenarioOrdering) {
  const Plan p = plan_for("gpt2-large", 2, "titan-rtx-24gb",
                          {"ddp/fp32/wrap=none", "zero1/fp32/wrap=none", "zero2/fp32/wrap=size:1000000",
                           "zero3/fp32/wrap=size:1000000", "zero3+offload/fp32/wrap=size:1000000",
                           "zero3/fp16/wrap=size:1000000", "zero3/fp32/wrap=block", "zero3+ckpt/fp32/wrap=block"});
  const int64_t ddp = max_batch(p, "ddp/fp32/wrap=none");
  const int64_t zero1 = max_batch(p, "zero1/fp32/wrap=none");
  const int64_t zero2 = max_batch(p, "zero2/fp32/wrap=size:1000000");
  const int64_t zero3 = max_batch(p, "zero3/fp32/wrap=size:1000000");
  const int64_t offload = max_batch(p, "zero3+offload/fp32/wrap=size:1000000");
  EXPECT_GT(ddp, 0);
  EXPECT_LT(ddp, zero1);
  EXPECT_LE(zero1, zero2);
  EXPECT_LT(zero2, zero3);
  EXPECT_LT(zero3, offload);
  EXPECT_GT(max_batch(p, "zero3/fp16/wrap=size:1000000"), zero3);
  EXPECT_GT(max_batch(p, "zero3+ckpt/fp32/wrap=block"), 2 * max_batch(p, "zero3/fp32/wrap=block"));
  EXPECT_FALSE(p.chosen.empty());
}

// What the reference measured: DDP cannot hold GPT-2 XL at batch 1 on a
// 24 GB card in fp32 or fp16, on one GPU or two; FULL_SHARD can.
TEST(PlanPhysics, Gpt2XlDdpDoesNotFitBatchOne) {
  for (int gpus : {1, 2}) {
    const Plan p = plan_for("gpt2-xl", gpus, "titan-rtx-24gb",
                            {"ddp/fp32/wrap=none", "ddp/fp16/wrap=none", "zero3+offload/fp32/wrap=size:2000"});
    EXPECT_EQ(max_batch(p, "ddp/fp32/wrap=none"), 0) << gpus;
    EXPECT_EQ(max_batch(p, "ddp/fp16/wrap=none"), 0) << gpus;
    EXPECT_GT(max_batch(p, "zero3+offload/fp32/wrap=size:2000"), 0) << gpus;
    EXPECT_NE(p.find("ddp/fp32/wrap=none")->limit.find("in step1/"), std::string::npos);
  }
}

TEST(PlanPhysics, MoreGpusShardMore) {
  int64_t previous = 0;
  for (int gpus : {1, 2, 4, 8}) {
    const Plan p = plan_for("gpt2-large", gpus, "titan-rtx-24gb", {"zero3/fp32/wrap=block"});
    const int64_t b = max_batch(p, "zero3/fp32/wrap=block");
    EXPECT_GE(b, previous) << gpus << " GPUs";
    previous = b;
  }
  EXPECT_GT(previous, 0);
}

// The search's promise, checked by re-simulating: the answer fits and the
// next batch does not, under the exact (CPU) and caching (CUDA) models.
TEST(PlanSearch, MaxFitsAndNextDoesNot) {
  for (const char* device : {"cpu", "titan-rtx-24gb"}) {
    PlanRequest r;
    r.model = models::resolve_model("gpt2-tiny");
    r.seq_len = 64;
    r.gpus_per_node = 2;
    r.profile = profile(device);
    r.device_mem_bytes = std::string(device) == "cpu" ? (int64_t{24} << 20) : (int64_t{2} << 30);
    r.candidates.strategies = {"ddp/fp32/wrap=none", "zero3/fp32/wrap=block", "zero2/bf16/wrap=none"};
    if (std::string(device) != "cpu") r.candidates.strategies.pop_back();  // Turing: no bf16
    const Plan p = build_plan(r);
    for (const auto& c : p.candidates) {
      ASSERT_GT(c.max_batch_per_gpu, 0) << c.id();
      EXPECT_LE(std::string(device) == "cpu" ? c.predicted.peak_allocated_bytes : c.predicted.peak_reserved_bytes,
                r.device_mem_bytes)
          << device << " " << c.id();
      EXPECT_NE(c.limit.find(" in step"), std::string::npos) << c.limit;
    }
  }
}

// Transformer activations are affine in batch: the trace extrapolated from
// batches 2 and 3 equals the trace made at batch 5, event for event.
TEST(BatchTraces, AffineExtrapolationIsExact) {
  const auto m = models::resolve_model("bert-tiny");
  TraceOptions o;
  o.seq_len = 32;
  o.batch = 2;
  ModelTrace t2 = trace_step(m, o);
  o.batch = 3;
  ModelTrace t3 = trace_step(m, o);
  o.batch = 5;
  const ModelTrace t5 = trace_step(m, o);
  const AffineTrace affine(std::move(t2), t3);
  const ModelTrace x5 = affine.at(5);
  ASSERT_EQ(x5.events.size(), t5.events.size());
  for (size_t i = 0; i < t5.events.size(); ++i) ASSERT_EQ(x5.events[i].bytes, t5.events[i].bytes) << i;
  EXPECT_DOUBLE_EQ(x5.forward_flops, t5.forward_flops);
}

TEST(RecomputeModules, BlocksWhenOnlyTheRootIsAUnit) {
  const auto modules = models::module_table(models::resolve_model("gpt2-tiny"));
  const auto none = wrap_modules(modules, WrapPolicy::parse("none"));
  const auto blocks = spec::recompute_modules(modules, none);
  ASSERT_EQ(blocks.size(), 2u);  // gpt2-tiny has 2 layers
  for (int m : blocks) EXPECT_TRUE(modules[m].is_block);
  EXPECT_EQ(spec::recompute_modules(modules, wrap_modules(modules, WrapPolicy::parse("block"))), blocks);
  // size:2000 wraps leaves inside blocks and never a block itself; none nested.
  const auto units = wrap_modules(modules, WrapPolicy::parse("size:2000"));
  for (int m : spec::recompute_modules(modules, units))
    for (int q : spec::recompute_modules(modules, units))
      for (int p = modules[m].parent; p >= 0; p = modules[p].parent) EXPECT_NE(p, q);
}

TEST(PlanInput, ImpossibleRequestsAreOneLineErrors) {
  PlanRequest r;
  r.model = models::resolve_model("gpt2-tiny");
  r.profile = profile("titan-rtx-24gb");
  r.seq_len = 4096;
  EXPECT_THROW(build_plan(r), std::invalid_argument);
  r.seq_len = 64;
  r.gpus_per_node = 0;
  EXPECT_THROW(build_plan(r), std::invalid_argument);
  r.gpus_per_node = 1;
  r.device_mem_bytes = 1 << 20;  // below the CUDA context estimate
  try {
    build_plan(r);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace shardfit::planner
