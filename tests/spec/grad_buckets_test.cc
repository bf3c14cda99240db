// DDP's gradient buckets as a DDP user knows them: filled in reverse
// registration order, the first closing at 1 MiB and every later one at
// bucket_cap_mb; here over shardfit's flat grad, which they slice in place.
#include "spec/grad_buckets.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace shardfit::spec {
namespace {

TEST(GradBuckets, AssignedInReverseRegistrationOrderFirstBucketSmall) {
  // Four 512 KiB parameters and a 3 MiB one: the first bucket (1 MiB)
  // closes after the last two, the next (cap 2 MiB) after the 3 MiB one.
  const std::vector<int64_t> bytes{512 << 10, 3 << 20, 512 << 10, 512 << 10, 512 << 10};
  const auto b = assign_buckets_by_size(bytes, 2 << 20, 1 << 20);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<int>{4, 3}));
  EXPECT_EQ(b[1], (std::vector<int>{2, 1}));
  EXPECT_EQ(b[2], (std::vector<int>{0})) << "what is left closes the last bucket";
  EXPECT_THROW(assign_buckets_by_size(bytes, 0), std::invalid_argument);
}

TEST(GradBuckets, DefaultsAreDdps) {
  EXPECT_EQ(kDdpBucketCapBytes, 25 * 1024 * 1024);
  EXPECT_EQ(kDdpFirstBucketBytes, 1024 * 1024);
  // A small model's gradients all fit the first bucket.
  EXPECT_EQ(assign_buckets_by_size({400, 400, 400}).size(), 1u);
}

// --ddp-bucket-cap-mb in bytes as DDP converts it, int(bucket_cap_mb *
// 1024 * 1024), and the option's one rule in MB and in bytes alike.
TEST(GradBuckets, BucketCapConvertsAsDdpAndHasOneRule) {
  EXPECT_EQ(bucket_cap_bytes(25), kDdpBucketCapBytes);
  EXPECT_EQ(bucket_cap_bytes(0.5), 512 * 1024);
  EXPECT_EQ(bucket_cap_bytes(1.0 / (1 << 20)), 1) << "one byte is the smallest bucket";
  for (const double mb : {0.0, -1.0, 0.5 / (1 << 20), 1e6 + 1}) EXPECT_THROW(bucket_cap_bytes(mb), std::invalid_argument);
  EXPECT_THROW(check_bucket_cap_bytes(0), std::invalid_argument);
  EXPECT_NO_THROW(check_bucket_cap_bytes(1));
  try {
    check_bucket_cap_bytes(-5);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--ddp-bucket-cap-mb (-5 bytes): must be at least one byte (1/1048576 MB) and at most 1e6 MB");
  }
}

std::vector<FlatParamLayout> two_units(int world) {
  // Unit 0: a (5) and b (3); unit 1: c (4). fp32.
  return {FlatParamLayout({{"a", {5}, 5}, {"b", {3}, 3}}, world), FlatParamLayout({{"c", {4}, 4}}, world)};
}

TEST(GradBuckets, EachBucketIsOneSliceOfTheFlatGrad) {
  // world 3 pads unit 0 to 9 elements: unit 1 starts at 9. A 12-byte cap
  // (and first cap) closes a bucket at every parameter of 3 elements or more.
  const GradBuckets g(two_units(3), 4, 12, 12);
  ASSERT_EQ(g.buckets().size(), 3u);
  EXPECT_EQ(g.buckets()[0].offset, 9) << "c, the last registered, fills first";
  EXPECT_EQ(g.buckets()[0].numel, 4);
  EXPECT_EQ(g.buckets()[1].offset, 5) << "b";
  EXPECT_EQ(g.buckets()[1].numel, 3);
  EXPECT_EQ(g.buckets()[2].offset, 0) << "a";
  EXPECT_EQ(g.buckets()[2].numel, 5);
  // One bucket over both units spans unit 0's padding too.
  const GradBuckets one(two_units(3), 4);
  ASSERT_EQ(one.buckets().size(), 1u);
  EXPECT_EQ(one.buckets()[0].offset, 0);
  EXPECT_EQ(one.buckets()[0].numel, 13);
  EXPECT_EQ(one.numels(), (std::vector<int64_t>{13}));
}

TEST(GradBuckets, ABucketIsReadyWhenItsLastGradientArrivesAndAUnitWhenItsBucketsAreReduced) {
  GradBuckets g(two_units(1), 4, 20, 20);  // buckets {c, b} (28 B) and {a}
  ASSERT_EQ(g.buckets().size(), 2u);
  EXPECT_EQ(g.param_ready(1, 0), -1) << "c alone does not complete {c, b}";
  EXPECT_EQ(g.param_ready(1, 0), -1) << "counted once per backward";
  EXPECT_EQ(g.param_ready(0, 1), 0);
  EXPECT_EQ(g.bucket_reduced(0), (std::vector<int>{1})) << "unit 1's only bucket; unit 0 still has {a}";
  EXPECT_EQ(g.param_ready(0, 0), 1);
  EXPECT_EQ(g.bucket_reduced(1), (std::vector<int>{0}));
  // The next backward starts over; a bucket launched at backward's end with
  // a gradient missing is not completed again by it.
  g.begin_backward();
  EXPECT_FALSE(g.ready(1));
  EXPECT_EQ(g.launch(0), (std::vector<int>{0}));
  EXPECT_EQ(g.launch(0), std::vector<int>{}) << "launched once per backward";
  EXPECT_EQ(g.launch(-1), (std::vector<int>{1})) << "when backward ends: every bucket not launched yet";
  EXPECT_EQ(g.param_ready(0, 0), -1);
}

}  // namespace
}  // namespace shardfit::spec
