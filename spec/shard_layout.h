// How a unit's parameters are flattened, padded and cut into shards: the one
// description that the planner simulates with and the executor allocates with
// (as llm.c sizes its buffers with the same arithmetic that plans them). Pure
// functions of (numel, world, rank); nothing here touches memory or a
// communicator.
//
// The padding rule is FSDP's (torch/distributed/fsdp/_flat_param.py,
// FlatParamHandle._get_shard): a flat parameter of `numel` elements is padded
// to padded = ceil(numel / world) * world, every rank holds padded / world
// elements, rank r holds the slice [r*s, (r+1)*s) of the padded buffer, so the
// padding lives at the end of the last rank(s). Parameters are packed back to
// back in registration order, with no per-parameter alignment (FSDP1 with
// use_orig_params=False).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/module_table.h"

namespace shardfit::spec {

// A contiguous slice, in elements.
struct ShardRange {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const ShardRange& o) const { return offset == o.offset && size == o.size; }
};

// ceil(numel / world) * world. Throws std::invalid_argument on numel < 0 or
// world < 1.
int64_t padded_numel(int64_t numel, int world);
// padded_numel(numel, world) / world: what every rank holds.
int64_t shard_numel(int64_t numel, int world);
// Rank `rank`'s slice of the padded flat buffer. Throws std::invalid_argument
// unless 0 <= rank < world.
ShardRange shard_range(int64_t numel, int world, int rank);
// How many elements of rank's shard are real (not padding): the part of
// shard_range() below numel.
int64_t shard_valid_numel(int64_t numel, int world, int rank);

// One parameter inside a flat buffer.
struct FlatParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // first element in the flat buffer
};

// The part of one parameter that lies in a rank's shard: elements
// [param_offset, param_offset + numel) of the parameter sit at
// [shard_offset, shard_offset + numel) of the shard.
struct ShardPiece {
  int param = 0;  // index into FlatParamLayout::params()
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t numel = 0;
  bool operator==(const ShardPiece& o) const {
    return param == o.param && param_offset == o.param_offset && shard_offset == o.shard_offset &&
           numel == o.numel;
  }
};

// A unit's flat parameter over a shard group of `world` ranks.
class FlatParamLayout {
 public:
  FlatParamLayout(const std::vector<ParamInfo>& params, int world);

  int world() const { return world_; }
  const std::vector<FlatParamEntry>& params() const { return params_; }
  // Real elements, without padding.
  int64_t numel() const { return numel_; }
  // numel() rounded up to a multiple of world().
  int64_t padded_numel() const { return padded_numel_; }
  int64_t padding_numel() const { return padded_numel_ - numel_; }
  // Elements each rank holds: padded_numel() / world().
  int64_t shard_numel() const { return padded_numel_ / world_; }
  ShardRange shard(int rank) const;
  // The parameter pieces in rank's shard, in flat order; empty when the shard
  // is pure padding. Padding is whatever the pieces leave uncovered.
  std::vector<ShardPiece> pieces(int rank) const;

 private:
  int world_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  std::vector<FlatParamEntry> params_;
};

}  // namespace shardfit::spec
