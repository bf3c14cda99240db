// The CPU allocator of the bf16 matmul probe (planner/cpu_matmul_probe.cc):
// tells an observer of every allocation (its address and size), and of the
// free of each block the observer asks to follow, then passes both to the
// allocator it wraps.
//
// A followed block keeps its address as its context (raw_allocate needs
// that); its deleter is this allocator's, which finds the wrapped one by
// address. Blocks not followed are the wrapped allocator's, untouched.
//
// Includes only c10's allocator interface (compat/c10_allocator.h): tests/
// compat/ compiles it against LibTorch 2.3+'s form of c10::Allocator too.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "compat/c10_allocator.h"

namespace shardfit::planner {

class ProbeCpuAllocator final : public c10::Allocator {
 public:
  // Returns true to be told, through OnFree, when this block is freed.
  using Observer = bool (*)(const void* data, size_t nbytes);
  using OnFree = void (*)(const void* data);
  // One per process (the raw deleter below is a plain function).
  ProbeCpuAllocator(c10::Allocator* base, Observer on_allocate, OnFree on_free)
      : base_(base), on_allocate_(on_allocate), on_free_(on_free) {
    base_raw_deleter() = base->raw_deleter();
  }

  SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_observed, shardfit::compat::copy_host_bytes)
  // raw_deallocate (oneDNN's scratchpads come and go through raw_allocate):
  // a followed block through free_followed, any other through the wrapped
  // allocator's own.
  c10::DeleterFnPtr raw_deleter() const override {
    return base_raw_deleter() ? &ProbeCpuAllocator::free_followed : nullptr;
  }

 private:
  struct Followed {
    c10::DeleterFnPtr deleter;
    OnFree on_free;
  };
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<void*, Followed>& followed() {
    static auto* blocks = new std::unordered_map<void*, Followed>();  // outlives static storages
    return *blocks;
  }
  static c10::DeleterFnPtr& base_raw_deleter() {
    static c10::DeleterFnPtr d = nullptr;
    return d;
  }
  static void free_followed(void* data) {
    Followed f{};
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = followed().find(data);
      if (it != followed().end()) {
        f = it->second;
        followed().erase(it);
        found = true;
      }
    }
    if (!found) {  // not followed: the wrapped allocator's own block
      base_raw_deleter()(data);
      return;
    }
    f.on_free(data);
    f.deleter(data);
  }

  c10::DataPtr allocate_observed(size_t nbytes) const {
    c10::DataPtr d = base_->allocate(nbytes);
    const bool follow = on_allocate_(d.get(), nbytes);
    if (!follow || d.get() == nullptr || d.get() != d.get_context()) return d;
    const c10::Device device = d.device();
    const c10::DeleterFnPtr deleter = d.get_deleter();
    void* data = d.release_context();
    {
      std::lock_guard<std::mutex> lock(mu());
      followed()[data] = Followed{deleter, on_free_};
    }
    return {data, data, &ProbeCpuAllocator::free_followed, device};
  }

  c10::Allocator* base_;
  Observer on_allocate_;
  OnFree on_free_;
};

}  // namespace shardfit::planner
