// The strategy traits as a user reads a candidate id: what each sharding
// shards, over which group, where the fp32 master lives, which dtypes are
// stored; and the one validator refusing what cannot run, in one line with
// the arithmetic.
#include "spec/strategy.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace shardfit::spec {
namespace {

StrategyTraits decode(const std::string& id, int world, int gpus_per_node = 0) {
  const Candidate c = parse_candidate(id);
  return decode_strategy(c, world, shard_group_for(c.sharding, world, gpus_per_node));
}

std::string refusal(const std::string& id, int world, int group) {
  try {
    decode_strategy(parse_candidate(id), world, group);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(StrategyTraitsTest, DdpShardsNothingAndReducesOnTheLastMicroBatch) {
  const StrategyTraits t = decode("ddp/fp32/wrap=none", 4);
  EXPECT_FALSE(t.shard_optimizer);
  EXPECT_FALSE(t.shard_grads);
  EXPECT_FALSE(t.shard_params);
  EXPECT_TRUE(t.keeps_full_params());
  EXPECT_FALSE(t.reduce_every_micro_batch());
  EXPECT_FALSE(t.all_gather_params_after_step());
  EXPECT_EQ(t.shard_group_size, 1);       // nothing is padded or cut
  EXPECT_EQ(t.collective_group_size, 4);  // its all-reduce spans the world
}

TEST(StrategyTraitsTest, Zero1ShardsOnlyTheOptimizerAndGathersAfterTheStep) {
  const StrategyTraits t = decode("zero1/fp32/wrap=none", 4);
  EXPECT_TRUE(t.shard_optimizer);
  EXPECT_FALSE(t.shard_grads);
  EXPECT_FALSE(t.shard_params);
  EXPECT_TRUE(t.all_gather_params_after_step());
  EXPECT_EQ(t.shard_group_size, 4);
}

TEST(StrategyTraitsTest, Zero2KeepsGatheredParamsThroughBackward) {
  const StrategyTraits t = decode("zero2/fp32/wrap=block", 2);
  EXPECT_TRUE(t.shard_params && t.shard_grads && t.shard_optimizer);
  EXPECT_FALSE(t.reshard_after_forward);
  EXPECT_TRUE(t.reduce_every_micro_batch());
}

TEST(StrategyTraitsTest, Zero3OffloadShardsEverythingAndKeepsTheMasterOnTheHost) {
  const StrategyTraits t = decode("zero3+offload/fp32/wrap=size:2000", 8);
  EXPECT_TRUE(t.shard_params);
  EXPECT_TRUE(t.shard_grads);
  EXPECT_TRUE(t.shard_optimizer);
  EXPECT_TRUE(t.reshard_after_forward);  // freed after forward, re-gathered for backward
  EXPECT_FALSE(t.replicate_across_groups);
  EXPECT_TRUE(t.offload);                // fp32 shards, grads and AdamW state on the host
  EXPECT_EQ(t.master_dtype, DType::kF32);
  EXPECT_EQ(t.shard_group_size, 8);
  EXPECT_FALSE(t.mixed());
  EXPECT_TRUE(t.staged_gather());  // the gather reads a host-to-device copy
}

TEST(StrategyTraitsTest, HybridShardsOverTheGpusOfANodeAndReplicatesAcrossNodes) {
  const StrategyTraits t = decode("hybrid/fp32/wrap=block", 8, /*gpus_per_node=*/4);
  EXPECT_EQ(t.shard_group_size, 4);
  EXPECT_EQ(t.collective_group_size, 4);
  EXPECT_TRUE(t.replicate_across_groups);
  EXPECT_TRUE(t.reshard_after_forward);
  // Without a node size the shard group is the whole world (one replica).
  EXPECT_EQ(decode("hybrid/fp32/wrap=block", 8).shard_group_size, 8);
}

TEST(StrategyTraitsTest, MixedPrecisionComputesLowAndKeepsAnFp32Master) {
  const StrategyTraits t = decode("zero3/bf16/wrap=block", 2);
  EXPECT_EQ(t.compute_dtype, DType::kBF16);
  EXPECT_EQ(t.master_dtype, DType::kF32);
  EXPECT_TRUE(t.mixed());
  EXPECT_TRUE(t.staged_gather());  // the fp32 shard is cast before the gather
  EXPECT_FALSE(decode("zero3/fp32/wrap=block", 2).staged_gather());  // the shard feeds it directly
}

TEST(StrategyTraitsTest, RecomputeAndOptimizerStates) {
  EXPECT_TRUE(decode("zero3+ckpt/fp32/wrap=block", 2).recompute);
  EXPECT_FALSE(decode("zero3/fp32/wrap=block", 2).recompute);
  EXPECT_EQ(decode("ddp/fp32/wrap=none", 1).optimizer_states, 2);  // AdamW
  EXPECT_EQ(decode_strategy(parse_candidate("ddp/fp32/wrap=none"), 1, 1, Optimizer::kSgd).optimizer_states, 0);
}

TEST(StrategyValidatorTest, RefusesImpossibleCombinationsInOneLine) {
  const std::string offload = refusal("ddp+offload/fp32/wrap=none", 2, 1);
  EXPECT_EQ(offload, "ddp+offload/fp32/wrap=none: offload needs sharded state (use zero1, zero2, zero3 or hybrid)");
  EXPECT_EQ(candidate_problem(parse_candidate("ddp+offload/fp32/wrap=none")),
            "offload needs sharded state (use zero1, zero2, zero3 or hybrid)");
  EXPECT_EQ(refusal("hybrid/fp32/wrap=block", 6, 4),
            "hybrid/fp32/wrap=block: the shard group (--gpus-per-node) of 4 ranks does not divide the world of 6 "
            "ranks (6 % 4 = 2)");
  EXPECT_EQ(refusal("zero3/fp32/wrap=block", 4, 2),
            "zero3/fp32/wrap=block: zero3 shards over the whole world: shard group 2 != world size 4");
  EXPECT_NE(refusal("zero2/fp32/wrap=block", 0, 0).find("world size 0 must be at least 1"), std::string::npos);
  for (const std::string& e : {offload, refusal("hybrid/fp32/wrap=block", 6, 4)})
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // What can run is not refused: ddp ignores the group; hybrid divides.
  EXPECT_EQ(strategy_problem(parse_candidate("ddp/fp32/wrap=none"), 3, 2), "");
  EXPECT_EQ(strategy_problem(parse_candidate("hybrid/fp32/wrap=block"), 4, 2), "");
}

TEST(StrategyTraitsTest, ShardGroupForEachSharding) {
  EXPECT_EQ(shard_group_for(Sharding::kDdp, 8, 4), 1);
  EXPECT_EQ(shard_group_for(Sharding::kZero1, 8, 4), 8);
  EXPECT_EQ(shard_group_for(Sharding::kZero3, 8, 4), 8);
  EXPECT_EQ(shard_group_for(Sharding::kHybrid, 8, 4), 4);
  EXPECT_EQ(shard_group_for(Sharding::kHybrid, 8, 0), 8);
}

TEST(CandidateTest, IdKeepsTheUserContractForRecompute) {
  const Candidate c = parse_candidate("zero3+ckpt+offload/bf16/wrap=size:2000");
  EXPECT_TRUE(c.recompute);
  EXPECT_EQ(c.to_id(), "zero3+offload+ckpt/bf16/wrap=size:2000");  // `+ckpt` stays in ids
  EXPECT_EQ(precision_of(compute_dtype(Precision::kBf16)), Precision::kBf16);
  EXPECT_EQ(precision_of(compute_dtype(Precision::kFp16)), Precision::kFp16);
}

}  // namespace
}  // namespace shardfit::spec
