// Sharding arithmetic, exact: FSDP's padding rule for worlds 1-8, uneven
// splits, a shard that cuts a parameter in two, a shard of pure padding.
#include "spec/shard_layout.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace shardfit::spec {
namespace {

ParamInfo param(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return ParamInfo{name, std::move(shape), n};
}

TEST(ShardRangeTest, PaddingForWorldsOneToEight) {
  // numel 10: padded = ceil(10 / w) * w.
  const int64_t expected_padded[] = {10, 10, 12, 12, 10, 12, 14, 16};
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE(world);
    EXPECT_EQ(padded_numel(10, world), expected_padded[world - 1]);
    const int64_t s = expected_padded[world - 1] / world;
    EXPECT_EQ(shard_numel(10, world), s);
    int64_t valid = 0;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(shard_range(10, world, r), (ShardRange{r * s, s}));
      valid += shard_valid_numel(10, world, r);
    }
    EXPECT_EQ(valid, 10);  // every real element is on exactly one rank
  }
}

TEST(ShardRangeTest, UnevenSplitPutsPaddingOnTheLastRanks) {
  // 10 over 4: s = 3, padded 12: ranks hold [0,3) [3,6) [6,9) [9,12); rank 3
  // has 1 real element and 2 of padding.
  EXPECT_EQ(shard_valid_numel(10, 4, 0), 3);
  EXPECT_EQ(shard_valid_numel(10, 4, 2), 3);
  EXPECT_EQ(shard_valid_numel(10, 4, 3), 1);
  // 5 over 4: s = 2, padded 8: rank 2 holds [4,6) = 1 real + 1 pad, rank 3
  // holds [6,8): pure padding.
  EXPECT_EQ(shard_valid_numel(5, 4, 2), 1);
  EXPECT_EQ(shard_valid_numel(5, 4, 3), 0);
  EXPECT_EQ(padded_numel(0, 4), 0);
  EXPECT_EQ(shard_range(0, 4, 3), (ShardRange{0, 0}));
}

TEST(ShardRangeTest, RejectsBadArguments) {
  EXPECT_THROW(padded_numel(10, 0), std::invalid_argument);
  EXPECT_THROW(padded_numel(-1, 2), std::invalid_argument);
  EXPECT_THROW(shard_range(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(shard_range(10, 2, -1), std::invalid_argument);
}

TEST(FlatParamLayoutTest, OffsetsAndPiecesWhenAShardCutsAParam) {
  // weight [2,3] = 6 at flat [0,6), bias [3] at [6,9): numel 9.
  // World 2: s = 5, padded 10. Rank 0 = flat [0,5): weight[0,5).
  // Rank 1 = flat [5,10): weight[5,6) at shard 0, bias[0,3) at shard 1..4,
  // then 1 element of padding.
  FlatParamLayout layout({param("w", {2, 3}), param("b", {3})}, 2);
  EXPECT_EQ(layout.numel(), 9);
  EXPECT_EQ(layout.padded_numel(), 10);
  EXPECT_EQ(layout.padding_numel(), 1);
  EXPECT_EQ(layout.shard_numel(), 5);
  ASSERT_EQ(layout.params().size(), 2u);
  EXPECT_EQ(layout.params()[0].offset, 0);
  EXPECT_EQ(layout.params()[1].offset, 6);
  EXPECT_EQ(layout.params()[1].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(layout.shard(1), (ShardRange{5, 5}));
  EXPECT_EQ(layout.pieces(0), (std::vector<ShardPiece>{{0, 0, 0, 5}}));
  EXPECT_EQ(layout.pieces(1), (std::vector<ShardPiece>{{0, 5, 0, 1}, {1, 0, 1, 3}}));
}

TEST(FlatParamLayoutTest, PurePaddingRankHasNoPieces) {
  // a [3] + b [2] = 5 over 4 ranks: s = 2, padded 8.
  // Rank 0 [0,2): a[0,2). Rank 1 [2,4): a[2,3) + b[0,1). Rank 2 [4,6):
  // b[1,2) + 1 pad. Rank 3 [6,8): padding only.
  FlatParamLayout layout({param("a", {3}), param("b", {2})}, 4);
  EXPECT_EQ(layout.pieces(0), (std::vector<ShardPiece>{{0, 0, 0, 2}}));
  EXPECT_EQ(layout.pieces(1), (std::vector<ShardPiece>{{0, 2, 0, 1}, {1, 0, 1, 1}}));
  EXPECT_EQ(layout.pieces(2), (std::vector<ShardPiece>{{1, 1, 0, 1}}));
  EXPECT_TRUE(layout.pieces(3).empty());
}

TEST(FlatParamLayoutTest, PiecesCoverEveryElementOnceForAllWorlds) {
  FlatParamLayout base({param("a", {7}), param("empty", {0}), param("b", {4, 5}), param("c", {3})},
                       1);
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE(world);
    FlatParamLayout layout(
        {param("a", {7}), param("empty", {0}), param("b", {4, 5}), param("c", {3})}, world);
    EXPECT_EQ(layout.numel(), 30);
    EXPECT_EQ(layout.padded_numel(), padded_numel(30, world));
    std::vector<int> seen(30, 0);
    for (int r = 0; r < world; ++r) {
      int64_t covered = 0;
      for (const ShardPiece& p : layout.pieces(r)) {
        const FlatParamEntry& e = layout.params()[p.param];
        EXPECT_NE(e.name, "empty");
        // The piece sits where flat order says it does.
        EXPECT_EQ(layout.shard(r).offset + p.shard_offset, e.offset + p.param_offset);
        for (int64_t k = 0; k < p.numel; ++k) ++seen[e.offset + p.param_offset + k];
        covered += p.numel;
      }
      EXPECT_EQ(covered, shard_valid_numel(30, world, r));
    }
    for (int v : seen) EXPECT_EQ(v, 1);
  }
  EXPECT_EQ(base.params()[3].offset, 27);
}

}  // namespace
}  // namespace shardfit::spec
