// DDP's gradient buckets (ddp, zero1): which parameters' gradients are
// all-reduced together, and when a bucket is ready.
//
// The assignment is DistributedDataParallel's (torch/nn/parallel/
// distributed.py, _compute_bucket_assignment_by_size in c10d's reducer.cpp):
// parameters taken in reverse registration order, since backward produces the
// last layers' gradients first; a bucket closes as soon as its bytes reach
// the limit, the first bucket's limit being 1 MiB
// (dist._DEFAULT_FIRST_BUCKET_BYTES) so that the first all-reduce starts
// early, every later one bucket_cap_mb (25 MiB by default). shardfit's
// engine keeps every gradient in one flat buffer (DDP's
// gradient_as_bucket_view), units in wrap order, each unit's parameters in
// registration order; a bucket, consecutive parameters of that order, is then
// one contiguous slice of the flat grad, reduced in place: buckets cost no
// memory, only collectives.
//
// A bucket is ready once each of its parameters has its gradient in the
// micro-batch that reduces (the last: no_sync before it). The engine learns
// it from autograd (each parameter's AccumulateGrad, as DDP's reducer does);
// the simulator, which has no per-parameter events, when each unit's backward
// ends. A unit's gradients are reduced once every bucket holding one of them
// is.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/shard_layout.h"

namespace shardfit::spec {

// DistributedDataParallel's defaults: bucket_cap_mb=25 (distributed.py), in
// bytes as it converts it (int(bucket_cap_mb * 1024 * 1024)), and the first
// bucket's 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES).
inline constexpr int64_t kDdpBucketCapBytes = 25LL << 20;
// --ddp-bucket-cap-mb's bounds: at least one byte, at most 1e6 MB (a bucket
// no model's gradients fill; beyond it the byte count nears int64's range).
inline constexpr double kMaxDdpBucketCapMb = 1e6;
// --ddp-bucket-cap-mb in bytes, converted as DistributedDataParallel
// converts bucket_cap_mb: int(bucket_cap_mb * 1024 * 1024). The option's one
// rule: throws std::invalid_argument, naming the option and the value, for a
// bucket under one byte, over kMaxDdpBucketCapMb, or not a number.
int64_t bucket_cap_bytes(double mb);
// The same rule for a cap already in bytes (a plan file's
// ddp_bucket_cap_bytes, a caller of the engine or the planner).
void check_bucket_cap_bytes(int64_t bytes);
inline constexpr int64_t kDdpFirstBucketBytes = 1LL << 20;

// The assignment alone: `param_bytes` in registration order; each bucket the
// parameter indices it holds, in the order backward fills them (reverse
// registration), buckets in the order they fill. Throws std::invalid_argument
// on a cap below 1 byte.
std::vector<std::vector<int>> assign_buckets_by_size(const std::vector<int64_t>& param_bytes,
                                                     int64_t cap_bytes = kDdpBucketCapBytes,
                                                     int64_t first_cap_bytes = kDdpFirstBucketBytes);

struct GradParamRef {
  int unit = 0;
  int param = 0;  // index into that unit's FlatParamLayout::params()
};

struct GradBucket {
  int64_t offset = 0;  // first element in the flat grad
  int64_t numel = 0;   // from its lowest parameter to the end of its highest
  std::vector<GradParamRef> params;
};

// The buckets over a flat grad holding `units` back to back (each padded to
// its padded_numel()), `elem_bytes` per element, and their readiness during
// one backward.
class GradBuckets {
 public:
  GradBuckets(const std::vector<FlatParamLayout>& units, int elem_bytes, int64_t cap_bytes = kDdpBucketCapBytes,
              int64_t first_cap_bytes = kDdpFirstBucketBytes);
  GradBuckets() = default;

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // The buckets' sizes in elements, in the order they become ready.
  std::vector<int64_t> numels() const;

  // A reducing backward begins: every bucket waits for all its parameters,
  // none is launched.
  void begin_backward();
  // Parameter `param` of `unit` has its gradient: the bucket it completed,
  // or -1 (not complete yet, launched already, or the parameter counted
  // already in this backward).
  int param_ready(int unit, int param);
  // The buckets to launch now, marked launched: `bucket` (>= 0) unless it
  // was; or (bucket < 0, when backward ends) every one not launched yet,
  // whose missing parameters got no gradient.
  std::vector<int> launch(int bucket);
  bool ready(int bucket) const { return missing_[bucket] == 0; }
  // Bucket `bucket`'s reduction completed: the units whose every bucket now
  // has, in unit order.
  std::vector<int> bucket_reduced(int bucket);

 private:
  std::vector<GradBucket> buckets_;
  std::vector<std::vector<int>> bucket_of_;    // [unit][param] -> bucket
  std::vector<std::vector<int>> units_of_;     // [bucket] -> units it touches
  std::vector<int> buckets_per_unit_;          // how many buckets touch a unit
  std::vector<std::vector<bool>> seen_;        // [unit][param]: gradient counted
  std::vector<int> missing_;                   // [bucket]: parameters still to come
  std::vector<bool> launched_;                 // [bucket]: in this backward
  std::vector<int> unreduced_;                 // [unit]: buckets still to reduce
};

}  // namespace shardfit::spec
