// The meter: what a rank really used. On the CPU it is a tracking allocator
// installed as LibTorch's CPU allocator, counting the bytes every storage
// asks for (exactly: the requested nbytes, the same figure the planner's
// ExactAllocator charges), their peak, and a timeline at named phases. It can
// enforce a byte budget: an allocation that would pass it throws
// c10::OutOfMemoryError, which the run reports as a result, not a crash.
//
// This is the ground truth every accuracy claim is measured against.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Allocator.h>

namespace shardfit::executor {

struct TimelinePoint {
  std::string phase;               // e.g. "init", "step1/forward"
  int64_t allocated_bytes = 0;     // live bytes when the phase ended
  int64_t peak_allocated_bytes = 0;  // highest live bytes since the previous point
};

class TrackingAllocator final : public c10::Allocator {
 public:
  // Wraps `base` (LibTorch's default CPU allocator when null).
  explicit TrackingAllocator(c10::Allocator* base = nullptr);

  // The process-wide meter, installed as the CPU allocator on first call.
  static TrackingAllocator& cpu();

  c10::DataPtr allocate(size_t nbytes) const override;
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

  // Starts a new measurement: peak := current, timeline cleared.
  void reset_peak();
  // Records the end of a phase.
  void mark(const std::string& phase);
  std::vector<TimelinePoint> timeline() const;

 private:
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

// True when `e` (or its message) is the meter's or LibTorch's out-of-memory
// error.
bool is_out_of_memory(const std::exception& e);

}  // namespace shardfit::executor
