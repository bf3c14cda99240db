#include "spec/strategy.h"

#include <stdexcept>

namespace shardfit::spec {

int optimizer_states(Optimizer optimizer) { return optimizer == Optimizer::kAdamW ? 2 : 0; }

const ShardingTraits& sharding_traits(Sharding sharding) {
  // {shard_optimizer, shard_grads, shard_params, reshard_after_forward, replicate_across_groups}
  static const ShardingTraits kDdp{false, false, false, false, false};
  static const ShardingTraits kZero1{true, false, false, false, false};
  static const ShardingTraits kZero2{true, true, true, false, false};
  static const ShardingTraits kZero3{true, true, true, true, false};
  static const ShardingTraits kHybrid{true, true, true, true, true};
  switch (sharding) {
    case Sharding::kDdp:
      return kDdp;
    case Sharding::kZero1:
      return kZero1;
    case Sharding::kZero2:
      return kZero2;
    case Sharding::kZero3:
      return kZero3;
    case Sharding::kHybrid:
      return kHybrid;
  }
  return kDdp;
}

int shard_group_for(Sharding sharding, int world_size, int gpus_per_node) {
  if (!sharding_traits(sharding).shard_optimizer) return 1;  // ddp shards nothing
  if (sharding_traits(sharding).replicate_across_groups) return gpus_per_node > 0 ? gpus_per_node : world_size;
  return world_size;
}

std::string candidate_problem(const Candidate& c) {
  if (c.offload && !sharding_traits(c.sharding).shard_optimizer)
    return "offload needs sharded state (use zero1, zero2, zero3 or hybrid)";
  return "";
}

std::string strategy_problem(const Candidate& c, int world_size, int shard_group_size) {
  const std::string problem = candidate_problem(c);
  if (!problem.empty()) return problem;
  if (world_size < 1) return "world size " + std::to_string(world_size) + " must be at least 1";
  const ShardingTraits& t = sharding_traits(c.sharding);
  if (!t.shard_optimizer) return "";  // ddp: nothing is sharded, any group size is moot
  const std::string name = sharding_name(c.sharding);
  const int g = shard_group_size, w = world_size;
  if (t.replicate_across_groups) {
    if (g < 1) return "the shard group (--gpus-per-node) of " + std::to_string(g) + " ranks must be at least 1";
    if (w % g != 0)
      return "the shard group (--gpus-per-node) of " + std::to_string(g) + " ranks does not divide the world of " +
             std::to_string(w) + " ranks (" + std::to_string(w) + " % " + std::to_string(g) + " = " +
             std::to_string(w % g) + ")";
  } else if (g != w) {
    return name + " shards over the whole world: shard group " + std::to_string(g) + " != world size " +
           std::to_string(w);
  }
  return "";
}

StrategyTraits decode_strategy(const Candidate& c, int world_size, int shard_group_size, Optimizer optimizer) {
  const std::string problem = strategy_problem(c, world_size, shard_group_size);
  if (!problem.empty()) throw std::invalid_argument(c.to_id() + ": " + problem);
  StrategyTraits t;
  static_cast<ShardingTraits&>(t) = sharding_traits(c.sharding);
  t.candidate = c;
  t.world_size = world_size;
  t.shard_group_size = t.shard_optimizer ? shard_group_size : 1;
  t.collective_group_size = t.shard_optimizer ? shard_group_size : world_size;
  t.offload = c.offload;
  t.recompute = c.recompute;
  t.compute_dtype = compute_dtype(c.precision);
  t.master_dtype = DType::kF32;
  t.optimizer_states = optimizer_states(optimizer);
  return t;
}

}  // namespace shardfit::spec
