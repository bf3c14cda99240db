// Allocator models on tiny hand-built sequences, every expected byte count
// worked out in the comments from the rules in allocator_model.h.
#include "planner/allocator_model.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace shardfit::planner {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

TEST(ExactAllocatorTest, CountsRequestedBytes) {
  ExactAllocator a;
  ASSERT_TRUE(a.alloc(0, 100, 0));
  ASSERT_TRUE(a.alloc(1, 201, 1));
  EXPECT_EQ(a.allocated_bytes(), 301);
  EXPECT_EQ(a.reserved_bytes(), 301);
  EXPECT_EQ(a.charged_bytes(1), 201);
  a.free(0);
  EXPECT_EQ(a.allocated_bytes(), 201);
  EXPECT_EQ(a.peak_allocated_bytes(), 301);
  EXPECT_EQ(a.charged_bytes(0), 0);
  a.free(0);  // not live: no-op
  a.free(99);
  EXPECT_EQ(a.allocated_bytes(), 201);
  EXPECT_THROW(a.alloc(1, 5, 0), std::logic_error);  // id 1 is live
  a.reset();
  EXPECT_EQ(a.allocated_bytes(), 0);
  EXPECT_EQ(a.peak_allocated_bytes(), 0);
  EXPECT_TRUE(a.alloc(1, 5, 0));
}

TEST(ExactAllocatorTest, OomPastBudgetLeavesStateUnchanged) {
  ExactAllocator a(250);
  ASSERT_TRUE(a.alloc(0, 200, 0));
  EXPECT_FALSE(a.alloc(1, 51, 0));  // 251 > 250
  EXPECT_EQ(a.allocated_bytes(), 200);
  EXPECT_EQ(a.charged_bytes(1), 0);
  EXPECT_TRUE(a.alloc(1, 50, 0));  // exactly at the budget fits
  EXPECT_EQ(a.allocated_bytes(), 250);
}

TEST(ExactAllocatorTest, ZeroBudgetIsUnlimited) {
  ExactAllocator a(0);
  EXPECT_TRUE(a.alloc(0, int64_t{1} << 50, 0));
}

TEST(CudaCachingAllocatorModelTest, RoundingAndSegmentRules) {
  using M = CudaCachingAllocatorModel;
  EXPECT_EQ(M::round_size(1), 512);
  EXPECT_EQ(M::round_size(512), 512);
  EXPECT_EQ(M::round_size(513), 1024);
  EXPECT_EQ(M::segment_size(M::round_size(1 * kMiB)), 2 * kMiB);       // small pool
  EXPECT_EQ(M::segment_size(M::round_size(1 * kMiB + 1)), 20 * kMiB);  // large, < 10 MiB
  EXPECT_EQ(M::segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(M::segment_size(10 * kMiB), 10 * kMiB);  // >= 10 MiB: rounded to 2 MiB
  EXPECT_EQ(M::segment_size(11 * kMiB), 12 * kMiB);
  EXPECT_TRUE(M::is_small(1 * kMiB));
  EXPECT_FALSE(M::is_small(1 * kMiB + 512));
}

TEST(CudaCachingAllocatorModelTest, SmallAllocsShareOneSegment) {
  CudaCachingAllocatorModel a;
  // 1000 -> 1024, 3000 -> 3072, 100000 -> 196 * 512 = 100352: all carved
  // from one 2 MiB small segment, back to back.
  ASSERT_TRUE(a.alloc(0, 1000, 0));
  ASSERT_TRUE(a.alloc(1, 3000, 0));
  ASSERT_TRUE(a.alloc(2, 100000, 0));
  EXPECT_EQ(a.allocated_bytes(), 1024 + 3072 + 100352);
  EXPECT_EQ(a.reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(a.num_segments(), 1);
  EXPECT_EQ(a.address_of(1) - a.address_of(0), 1024);
  EXPECT_EQ(a.address_of(2) - a.address_of(0), 1024 + 3072);
  EXPECT_EQ(a.charged_bytes(2), 100352);
}

TEST(CudaCachingAllocatorModelTest, LargeRequestSplitsA20MiBSegment) {
  CudaCachingAllocatorModel a;
  // 1.5 MiB > 1 MiB: large pool, < 10 MiB: a 20 MiB segment; the 18.5 MiB
  // remainder (> 1 MiB) is split off and cached.
  ASSERT_TRUE(a.alloc(0, 3 * kMiB / 2, 0));
  EXPECT_EQ(a.allocated_bytes(), 3 * kMiB / 2);
  EXPECT_EQ(a.reserved_bytes(), 20 * kMiB);
  // 5 MiB is served from that cached 18.5 MiB block (13.5 MiB left, split).
  ASSERT_TRUE(a.alloc(1, 5 * kMiB, 0));
  EXPECT_EQ(a.allocated_bytes(), 3 * kMiB / 2 + 5 * kMiB);
  EXPECT_EQ(a.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(a.num_segments(), 1);
  EXPECT_EQ(a.address_of(1) - a.address_of(0), 3 * kMiB / 2);
}

TEST(CudaCachingAllocatorModelTest, UnsplitRemainderIsChargedWhole) {
  CudaCachingAllocatorModel a;
  // 11 MiB >= 10 MiB: a segment rounded up to 12 MiB; the 1 MiB remainder is
  // not > 1 MiB, so it is not split and the block is charged 12 MiB.
  ASSERT_TRUE(a.alloc(0, 11 * kMiB, 0));
  EXPECT_EQ(a.reserved_bytes(), 12 * kMiB);
  EXPECT_EQ(a.allocated_bytes(), 12 * kMiB);
  EXPECT_EQ(a.charged_bytes(0), 12 * kMiB);
  // A 0-byte request gets nullptr in PyTorch: nothing is charged.
  ASSERT_TRUE(a.alloc(1, 0, 0));
  EXPECT_EQ(a.allocated_bytes(), 12 * kMiB);
  EXPECT_EQ(a.charged_bytes(1), 0);
}

TEST(CudaCachingAllocatorModelTest, FreeMergesNeighboursAndBestFitReuses) {
  CudaCachingAllocatorModel a;
  // One 20 MiB segment: x @0 (4 MiB), y @4 (4 MiB), z @8 (4 MiB), tail @12 (8 MiB free).
  ASSERT_TRUE(a.alloc(0, 4 * kMiB, 0));
  ASSERT_TRUE(a.alloc(1, 4 * kMiB, 0));
  ASSERT_TRUE(a.alloc(2, 4 * kMiB, 0));
  const int64_t base = a.address_of(0);
  a.free(0);
  a.free(1);  // merges with x: one 8 MiB free block @0
  EXPECT_EQ(a.allocated_bytes(), 4 * kMiB);
  // 7 MiB: the free blocks are 8 MiB @0 and 8 MiB @12; equal size, lower
  // address wins. 1 MiB would remain: not > 1 MiB, so no split: charged 8 MiB.
  ASSERT_TRUE(a.alloc(3, 7 * kMiB, 0));
  EXPECT_EQ(a.address_of(3), base);
  EXPECT_EQ(a.charged_bytes(3), 8 * kMiB);
  EXPECT_EQ(a.allocated_bytes(), 12 * kMiB);
  EXPECT_EQ(a.reserved_bytes(), 20 * kMiB);
  // Free everything: the segment merges back into one 20 MiB block, which a
  // 20 MiB request reuses without a new segment.
  a.free(3);
  a.free(2);
  ASSERT_TRUE(a.alloc(4, 20 * kMiB, 0));
  EXPECT_EQ(a.address_of(4), base);
  EXPECT_EQ(a.num_segments(), 1);
  EXPECT_EQ(a.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(a.peak_allocated_bytes(), 20 * kMiB);
}

TEST(CudaCachingAllocatorModelTest, StreamsDoNotShareCachedBlocks) {
  CudaCachingAllocatorModel a;
  ASSERT_TRUE(a.alloc(0, 1000, 0));
  a.free(0);  // a cached 2 MiB small segment on stream 0
  ASSERT_TRUE(a.alloc(1, 1000, 1));
  EXPECT_EQ(a.reserved_bytes(), 4 * kMiB);  // stream 1 needs its own segment
  ASSERT_TRUE(a.alloc(2, 1000, 0));
  EXPECT_EQ(a.reserved_bytes(), 4 * kMiB);  // stream 0 reuses its cache
  EXPECT_EQ(a.num_segments(), 2);
}

TEST(CudaCachingAllocatorModelTest, ReleasesCachedSegmentsAndRetriesUnderBudget) {
  CudaCachingAllocatorModel a(40 * kMiB);
  ASSERT_TRUE(a.alloc(0, 1000, 0));       // 2 MiB small segment
  ASSERT_TRUE(a.alloc(1, 30 * kMiB, 0));  // 30 MiB segment; reserved 32 MiB
  a.free(0);
  a.free(1);  // both cached, fully free
  // 36 MiB: no cached block fits; 32 + 36 > 40, so both cached segments are
  // released (a retry) and the 36 MiB segment fits alone.
  ASSERT_TRUE(a.alloc(2, 36 * kMiB, 0));
  EXPECT_EQ(a.num_alloc_retries(), 1);
  EXPECT_EQ(a.reserved_bytes(), 36 * kMiB);
  EXPECT_EQ(a.num_segments(), 1);
  EXPECT_EQ(a.peak_reserved_bytes(), 36 * kMiB);
}

TEST(CudaCachingAllocatorModelTest, OomLeavesStateUnchanged) {
  CudaCachingAllocatorModel a(40 * kMiB);
  ASSERT_TRUE(a.alloc(0, 30 * kMiB, 0));  // 30 MiB segment
  ASSERT_TRUE(a.alloc(1, 1000, 0));       // 2 MiB small segment
  a.free(1);                              // cached; reserved 32 MiB
  // 9 MiB needs a 20 MiB segment: 32 + 20 > 40, and even without the cached
  // 2 MiB segment 30 + 20 > 40: OOM, nothing released, nothing counted.
  EXPECT_FALSE(a.alloc(2, 9 * kMiB, 0));
  EXPECT_EQ(a.allocated_bytes(), 30 * kMiB);
  EXPECT_EQ(a.reserved_bytes(), 32 * kMiB);
  EXPECT_EQ(a.num_segments(), 2);
  EXPECT_EQ(a.num_alloc_retries(), 0);
  EXPECT_EQ(a.charged_bytes(2), 0);
  // The cached small block still serves small requests.
  ASSERT_TRUE(a.alloc(2, 2 * kKiB, 0));
  EXPECT_EQ(a.reserved_bytes(), 32 * kMiB);
}

TEST(CudaCachingAllocatorModelTest, ResetForgetsEverything) {
  CudaCachingAllocatorModel a(40 * kMiB);
  ASSERT_TRUE(a.alloc(0, 30 * kMiB, 0));
  a.reset();
  EXPECT_EQ(a.reserved_bytes(), 0);
  EXPECT_EQ(a.peak_reserved_bytes(), 0);
  EXPECT_EQ(a.num_segments(), 0);
  EXPECT_EQ(a.budget_bytes(), 40 * kMiB);
  EXPECT_TRUE(a.alloc(0, 30 * kMiB, 0));
}

}  // namespace
}  // namespace shardfit::planner
