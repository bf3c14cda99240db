#include "spec/shard_layout.h"

#include <algorithm>
#include <stdexcept>

namespace shardfit::spec {
namespace {

void check_world(int64_t numel, int world) {
  if (world < 1) {
    throw std::invalid_argument("shard group size " + std::to_string(world) +
                                " must be at least 1");
  }
  if (numel < 0)
    throw std::invalid_argument("flat parameter numel " + std::to_string(numel) + " is negative");
}

void check_rank(int world, int rank) {
  if (rank < 0 || rank >= world) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside the shard group of " +
                                std::to_string(world) + " ranks");
  }
}

}  // namespace

int64_t padded_numel(int64_t numel, int world) {
  check_world(numel, world);
  return (numel + world - 1) / world * world;
}

int64_t shard_numel(int64_t numel, int world) { return padded_numel(numel, world) / world; }

ShardRange shard_range(int64_t numel, int world, int rank) {
  const int64_t s = shard_numel(numel, world);
  check_rank(world, rank);
  return ShardRange{rank * s, s};
}

int64_t shard_valid_numel(int64_t numel, int world, int rank) {
  const ShardRange r = shard_range(numel, world, rank);
  return std::clamp<int64_t>(numel - r.offset, 0, r.size);
}

FlatParamLayout::FlatParamLayout(const std::vector<ParamInfo>& params, int world) : world_(world) {
  params_.reserve(params.size());
  for (const ParamInfo& p : params) {
    if (p.numel < 0) throw std::invalid_argument("parameter " + p.name + " has negative numel");
    params_.push_back(FlatParamEntry{p.name, p.shape, p.numel, numel_});
    numel_ += p.numel;
  }
  padded_numel_ = spec::padded_numel(numel_, world);
}

ShardRange FlatParamLayout::shard(int rank) const { return shard_range(numel_, world_, rank); }

std::vector<ShardPiece> FlatParamLayout::pieces(int rank) const {
  const ShardRange r = shard(rank);
  const int64_t begin = r.offset;
  const int64_t end = r.offset + r.size;
  std::vector<ShardPiece> out;
  // Parameters are sorted by offset: skip those that end before the shard.
  auto it =
      std::upper_bound(params_.begin(), params_.end(), begin,
                       [](int64_t b, const FlatParamEntry& e) { return b < e.offset + e.numel; });
  for (; it != params_.end() && it->offset < end; ++it) {
    if (it->numel == 0) continue;
    const int64_t lo = std::max(begin, it->offset);
    const int64_t hi = std::min(end, it->offset + it->numel);
    out.push_back(
        ShardPiece{static_cast<int>(it - params_.begin()), lo - it->offset, lo - begin, hi - lo});
  }
  return out;
}

}  // namespace shardfit::spec
