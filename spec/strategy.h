// What a candidate strategy means, decoded once: which state is sharded and
// over how many ranks, when a unit's parameters are gathered and freed,
// where the fp32 master lives, whether units recompute, which dtypes are
// stored and computed in, how many optimizer states there are. The planner
// (step simulator, time model, plan builder), the engine and the CLI all ask
// these traits instead of comparing Sharding values, and validate with the
// one validator below (torchtitan's parallel_dims: one object, validated
// once, derived properties, the arithmetic in the error).
//
// With P_u a unit's flat numel padded to the shard group N (shard_layout.h)
// and s_u = P_u / N:
//            optimizer  grads   params  reshard after fwd  across groups
//   ddp      full       full    full    -                  -
//   zero1    shard      full    full    -                  -
//   zero2    shard      shard   shard   no (kept to bwd)   -
//   zero3    shard      shard   shard   yes (not the root) -
//   hybrid   shard      shard   shard   yes (not the root) all-reduce
// "full" state is P_u elements on every rank; "shard" is s_u. Sharded params
// are all-gathered per unit (pre-forward, pre-backward) and freed after it.
#pragma once

#include <cstdint>
#include <string>

#include "spec/candidate.h"
#include "spec/dtype.h"

namespace shardfit::spec {

enum class Optimizer : uint8_t {
  kAdamW,  // exp_avg + exp_avg_sq: 8 bytes of state per element
  kSgd,    // plain SGD without momentum: no state
};
// fp32 states per element: AdamW 2, SGD 0.
int optimizer_states(Optimizer optimizer);

// What the sharding alone decides, whatever the world and precision.
struct ShardingTraits {
  // Optimizer state (and the update) on this rank's s_u slice: every
  // strategy but ddp.
  bool shard_optimizer = false;
  // Gradients reduce-scattered into fp32 shard grads (zero2/zero3/hybrid);
  // otherwise one flat grad buffer, all-reduced in place.
  bool shard_grads = false;
  // Only the fp32 shard persists (zero2/zero3/hybrid): the unit's params are
  // all-gathered before it runs and freed after its backward.
  bool shard_params = false;
  // The gathered params are freed after forward too and re-gathered for
  // backward (zero3/hybrid; the root unit, which backward needs first,
  // keeps them).
  bool reshard_after_forward = false;
  // Shard groups are replicas of each other: each shard grad is all-reduced
  // across them after its reduce-scatter (hybrid).
  bool replicate_across_groups = false;

  // Whole params on every rank between steps (ddp, zero1), so the wrap
  // policy only decides recomputation, not memory.
  bool keeps_full_params() const { return !shard_params; }
  // zero1: the updated shards are all-gathered into the full params after
  // the optimizer step.
  bool all_gather_params_after_step() const { return shard_optimizer && !shard_params; }
  // Sharded grads are reduced on every micro-batch; a flat grad buffer only
  // on the last (DDP's no_sync).
  bool reduce_every_micro_batch() const { return shard_grads; }
};
const ShardingTraits& sharding_traits(Sharding sharding);
inline bool keeps_full_params(Sharding sharding) { return sharding_traits(sharding).keeps_full_params(); }

struct StrategyTraits : ShardingTraits {
  Candidate candidate;
  int world_size = 1;
  // Ranks a flat param is padded and sharded over: 1 for ddp (nothing is
  // sharded), the world for zero1/2/3, the GPUs of a node for hybrid.
  int shard_group_size = 1;
  // Ranks a unit's ring collective spans: the world for ddp (its
  // all-reduce) and zero1/2/3, the shard group for hybrid. The time model
  // sizes its rings, and pads each unit, to it.
  int collective_group_size = 1;
  // fp32 master shards, shard grads and optimizer state live on the host,
  // and the optimizer runs there.
  bool offload = false;
  // +ckpt: units re-run their forward inside backward (spec/recompute.h).
  bool recompute = false;
  // Forward/backward, gathered params, unsharded grads and their reduction.
  DType compute_dtype = DType::kF32;
  // Master weights, shard grads and optimizer state, whatever the precision.
  DType master_dtype = DType::kF32;
  int optimizer_states = 2;

  // Low-precision compute with fp32 master weights.
  bool mixed() const { return compute_dtype != master_dtype; }
  // A gather is fed by a staging copy of the shard (a cast to the compute
  // dtype, or a host-to-device copy), not by the shard itself.
  bool staged_gather() const { return mixed() || offload; }
};

// The shard group a sharding uses in a world of `world_size` ranks with
// `gpus_per_node` per node: 1 for ddp, gpus_per_node for hybrid (0: the
// whole world), the world otherwise.
int shard_group_for(Sharding sharding, int world_size, int gpus_per_node);

// The validator. Why `candidate` cannot run whatever the world (ddp with
// +offload), or "" if it can.
std::string candidate_problem(const Candidate& candidate);
// Why `candidate` cannot run on `world_size` ranks sharding over
// `shard_group_size` (ignored for ddp), or "": one line with the arithmetic.
std::string strategy_problem(const Candidate& candidate, int world_size, int shard_group_size);

// The traits, validated. Throws std::invalid_argument "ID: <problem>".
StrategyTraits decode_strategy(const Candidate& candidate, int world_size, int shard_group_size,
                               Optimizer optimizer = Optimizer::kAdamW);

}  // namespace shardfit::spec
