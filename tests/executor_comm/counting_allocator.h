// A counting CPU allocator for tests/executor_comm/comm_test_worker.cc: the
// live bytes and their peak, so a rank can measure what a collective
// allocates beyond its inputs and outputs.
//
// Includes only c10's allocator interface (compat/c10_allocator.h): tests/
// compat/ compiles it against LibTorch 2.3+'s form of c10::Allocator too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "compat/c10_allocator.h"

namespace shardfit::executor {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_counted, shardfit::compat::copy_host_bytes)
  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }

  // Starts a measurement; returns the live bytes now.
  int64_t reset() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
    return live_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  // The one installed as the CPU allocator (release() finds it here).
  inline static CountingAllocator* instance = nullptr;

 private:
  c10::DataPtr allocate_counted(size_t nbytes) const {
    void* p = base_->raw_allocate(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = nbytes;
      live_ += static_cast<int64_t>(nbytes);
      peak_ = std::max(peak_, live_);
    }
    return {p, p, &CountingAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  static void release(void* p) {
    auto* self = instance;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->sizes_.find(p);
      if (it != self->sizes_.end()) {
        self->live_ -= static_cast<int64_t>(it->second);
        self->sizes_.erase(it);
      }
    }
    self->base_->raw_deallocate(p);
  }

  c10::Allocator* base_;
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable int64_t live_ = 0, peak_ = 0;
};

}  // namespace shardfit::executor
