#include "spec/grad_buckets.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace shardfit::spec {
namespace {
constexpr double kBytesPerMb = 1024.0 * 1024.0;

[[noreturn]] void bad_bucket_cap(const std::string& given) {
  throw std::invalid_argument("--ddp-bucket-cap-mb " + given +
                              ": must be at least one byte (1/1048576 MB) and at most 1e6 MB");
}
}  // namespace

int64_t bucket_cap_bytes(double mb) {
  if (!std::isfinite(mb) || mb > kMaxDdpBucketCapMb || mb * kBytesPerMb < 1) {
    char given[32];
    std::snprintf(given, sizeof given, "%g", mb);
    bad_bucket_cap(given);
  }
  return static_cast<int64_t>(mb * kBytesPerMb);
}

void check_bucket_cap_bytes(int64_t bytes) {
  if (bytes < 1 || static_cast<double>(bytes) > kMaxDdpBucketCapMb * kBytesPerMb)
    bad_bucket_cap("(" + std::to_string(bytes) + " bytes)");
}

std::vector<std::vector<int>> assign_buckets_by_size(const std::vector<int64_t>& param_bytes, int64_t cap_bytes,
                                                     int64_t first_cap_bytes) {
  if (cap_bytes < 1 || first_cap_bytes < 1)
    throw std::invalid_argument("bucket cap " + std::to_string(std::min(cap_bytes, first_cap_bytes)) +
                                " bytes: must be at least 1");
  std::vector<std::vector<int>> buckets;
  std::vector<int> open;
  int64_t open_bytes = 0;
  for (int i = static_cast<int>(param_bytes.size()) - 1; i >= 0; --i) {
    open.push_back(i);
    open_bytes += param_bytes[i];
    if (open_bytes >= (buckets.empty() ? first_cap_bytes : cap_bytes)) {
      buckets.push_back(std::move(open));
      open.clear();
      open_bytes = 0;
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

GradBuckets::GradBuckets(const std::vector<FlatParamLayout>& units, int elem_bytes, int64_t cap_bytes,
                         int64_t first_cap_bytes) {
  // Every parameter in flat-grad order, with where it sits.
  std::vector<GradParamRef> refs;
  std::vector<int64_t> bytes, offsets;
  int64_t unit_offset = 0;
  bucket_of_.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& params = units[u].params();
    bucket_of_[u].assign(params.size(), -1);
    for (size_t i = 0; i < params.size(); ++i) {
      refs.push_back({static_cast<int>(u), static_cast<int>(i)});
      bytes.push_back(params[i].numel * elem_bytes);
      offsets.push_back(unit_offset + params[i].offset);
    }
    unit_offset += units[u].padded_numel();
  }
  buckets_per_unit_.assign(units.size(), 0);
  for (const std::vector<int>& members : assign_buckets_by_size(bytes, cap_bytes, first_cap_bytes)) {
    GradBucket b;
    const int lo = *std::min_element(members.begin(), members.end());
    const int hi = *std::max_element(members.begin(), members.end());
    b.offset = offsets[lo];
    b.numel = offsets[hi] + bytes[hi] / elem_bytes - b.offset;
    std::vector<int> touched;
    for (int m : members) {
      b.params.push_back(refs[m]);
      bucket_of_[refs[m].unit][refs[m].param] = static_cast<int>(buckets_.size());
      if (std::find(touched.begin(), touched.end(), refs[m].unit) == touched.end()) touched.push_back(refs[m].unit);
    }
    std::sort(touched.begin(), touched.end());
    for (int u : touched) ++buckets_per_unit_[u];
    units_of_.push_back(std::move(touched));
    buckets_.push_back(std::move(b));
  }
  begin_backward();
}

std::vector<int64_t> GradBuckets::numels() const {
  std::vector<int64_t> out;
  for (const GradBucket& b : buckets_) out.push_back(b.numel);
  return out;
}

void GradBuckets::begin_backward() {
  seen_.resize(bucket_of_.size());
  for (size_t u = 0; u < bucket_of_.size(); ++u) seen_[u].assign(bucket_of_[u].size(), false);
  missing_.clear();
  for (const GradBucket& b : buckets_) missing_.push_back(static_cast<int>(b.params.size()));
  launched_.assign(buckets_.size(), false);
  unreduced_ = buckets_per_unit_;
}

int GradBuckets::param_ready(int unit, int param) {
  if (seen_[unit][param]) return -1;
  seen_[unit][param] = true;
  const int b = bucket_of_[unit][param];
  return --missing_[b] == 0 && !launched_[b] ? b : -1;
}

std::vector<int> GradBuckets::launch(int bucket) {
  std::vector<int> now;
  const int end = bucket < 0 ? static_cast<int>(buckets_.size()) : bucket + 1;
  for (int b = bucket < 0 ? 0 : bucket; b < end; ++b) {
    if (launched_[b]) continue;
    launched_[b] = true;
    now.push_back(b);
  }
  return now;
}

std::vector<int> GradBuckets::bucket_reduced(int bucket) {
  std::vector<int> done;
  for (int u : units_of_[bucket])
    if (--unreduced_[u] == 0) done.push_back(u);
  return done;
}

}  // namespace shardfit::spec
