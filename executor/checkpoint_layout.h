// UnitShardLayout: how one rank's shard cuts a unit's parameters, as a
// checkpoint records it. LibTorch-free, so the checkpoint readers
// (executor/checkpoint_format.h) build without LibTorch for the fuzz
// targets and the sanitizer build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/shard_layout.h"

namespace shardfit::executor {

// One unit's flat parameter as one rank holds it: the FlatParamLayout
// (parameters with their Hugging Face names, shapes and flat offsets; the
// padded and per-shard sizes) plus which shard this rank holds and which of
// RankState::tensors holds it. numel, padded_numel and shard_numel are
// derived from params and shard_group_size by FlatParamLayout's padding
// rule; they are stored so a reader needs no arithmetic, and checked on
// save and load.
struct UnitShardLayout {
  std::string unit;          // the unit's name, e.g. "transformer.h.0", "root"
  std::string param_tensor;  // key in RankState::tensors: this rank's 1-D shard
  // Ranks the flat parameter is cut over, and which cut this rank holds:
  // world and rank under full sharding, GPUs per node and local rank under
  // hybrid sharding, 1 and 0 when replicated (ddp).
  int shard_group_size = 1;
  int shard_index = 0;
  std::vector<spec::FlatParamEntry> params;  // flattening order
  int64_t numel = 0;
  int64_t padded_numel = 0;
  int64_t shard_numel = 0;

  static UnitShardLayout from(std::string unit, std::string param_tensor,
                              const spec::FlatParamLayout& layout, int shard_index);
  // The same layout, rebuilt (the pieces of each shard come from it).
  spec::FlatParamLayout flat_layout() const;
  bool operator==(const UnitShardLayout& o) const;
  bool operator!=(const UnitShardLayout& o) const { return !(*this == o); }
};

// "rank-<rank>-of-<world_size>.shardfit"
std::string rank_file_name(int rank, int world_size);

}  // namespace shardfit::executor
