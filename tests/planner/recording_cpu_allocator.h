// A CPU allocator for tests/planner/cpu_kernels_test.cc: tells an observer
// the size of every allocation, then passes it to the allocator it wraps.
//
// Includes only c10's allocator interface (compat/c10_allocator.h): tests/
// compat/ compiles it against LibTorch 2.3+'s form of c10::Allocator too.
#pragma once

#include <cstddef>

#include "compat/c10_allocator.h"

namespace shardfit::planner {

class RecordingCpuAllocator final : public c10::Allocator {
 public:
  using Observer = void (*)(size_t nbytes);
  RecordingCpuAllocator(c10::Allocator* base, Observer on_allocate)
      : base_(base), on_allocate_(on_allocate) {}

  SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_observed, shardfit::compat::copy_host_bytes)
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

 private:
  c10::DataPtr allocate_observed(size_t nbytes) const {
    on_allocate_(nbytes);
    return base_->allocate(nbytes);
  }

  c10::Allocator* base_;
  Observer on_allocate_;
};

}  // namespace shardfit::planner
