// The CPU meter's allocator: installed as LibTorch's CPU allocator, it counts
// the bytes every storage asks for (exactly: the requested nbytes, the same
// figure the planner's ExactAllocator charges), their peak, and a timeline at
// named phases. It can enforce a byte budget: an allocation that would pass
// it throws c10::OutOfMemoryError, which the run reports as a result, not a
// crash. executor/meter.h builds the engine's DeviceMeter on it.
//
// This header includes only c10's allocator interface (compat/c10_allocator.h)
// so that tests/compat/ can compile the class against LibTorch 2.3+'s form of
// c10::Allocator on a machine that has only 1.13.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "compat/c10_allocator.h"
#include "spec/timeline.h"

namespace shardfit::executor {

using spec::TimelinePoint;  // label, allocated, reserved (0 here: DeviceMeter fills it), peaks

class TrackingAllocator final : public c10::Allocator {
 public:
  // Wraps `base` (LibTorch's default CPU allocator when null).
  explicit TrackingAllocator(c10::Allocator* base = nullptr);

  // The process-wide meter, installed as the CPU allocator on first call.
  static TrackingAllocator& cpu();

  // allocate() (and copy_data() on LibTorch 2.3+) in this LibTorch's form.
  SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_tracked, shardfit::compat::copy_host_bytes)
  // Some LibTorch code calls raw_allocate/raw_deallocate on the CPU
  // allocator, which requires data == context and a fixed deleter: so sizes
  // live in a side table keyed by address, not in the DataPtr's context.
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

  int64_t allocated_bytes() const { return allocated_.load(); }
  int64_t peak_allocated_bytes() const { return peak_.load(); }
  int64_t num_allocs() const { return num_allocs_.load(); }
  // Budget in bytes; 0 = unlimited. An allocation that would take the live
  // total past it throws c10::OutOfMemoryError and allocates nothing.
  void set_budget_bytes(int64_t budget) { budget_.store(budget); }
  int64_t budget_bytes() const { return budget_.load(); }

  // Called on every tracked allocation (bytes > 0) and on the release of
  // every block (bytes = 0), with the block's address; null = none. The
  // tracer inside a Python process (pytorch/trace_capi.cc) records with it
  // the host storages a meta-device trace makes, which are the CPU's own
  // (scalars wrapped as tensors). Called under no lock of the allocator's.
  using Observer = void (*)(const void* data, int64_t bytes);
  static void set_observer(Observer observer);

  // Starts a new measurement: peak := current, timeline cleared.
  void reset_peak();
  // Records the end of a phase.
  void mark(const std::string& phase);
  std::vector<TimelinePoint> timeline() const;

 private:
  // The allocation itself, whatever the LibTorch version.
  c10::DataPtr allocate_tracked(size_t nbytes) const;
  static void release(void* data);
  void on_alloc(int64_t allocated_now) const;  // peaks and counts

  c10::Allocator* base_;
  mutable std::atomic<int64_t> allocated_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> peak_since_mark_{0};
  mutable std::atomic<int64_t> num_allocs_{0};
  std::atomic<int64_t> budget_{0};
  mutable std::mutex mu_;
  std::vector<TimelinePoint> timeline_;
};

// While alive, allocations on this process are not counted (and their frees
// are not subtracted): for memory that stands outside the device being
// emulated, e.g. the full model built on the host before its shards are
// cut, as FSDP builds on CPU or meta and moves only shards to the GPU.
class ScopedUntracked {
 public:
  ScopedUntracked();
  ~ScopedUntracked();
  ScopedUntracked(const ScopedUntracked&) = delete;
  ScopedUntracked& operator=(const ScopedUntracked&) = delete;
};

}  // namespace shardfit::executor
