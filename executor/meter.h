// The meter: what a rank really used. On the CPU it is a tracking allocator
// installed as LibTorch's CPU allocator (executor/tracking_allocator.h),
// counting the bytes every storage asks for, their peak, and a timeline at
// named phases, under an optional byte budget.
//
// On a GPU the ground truth is the CUDA caching allocator's own statistics
// (executor/cuda_meter.h). DeviceMeter below is what the engine measures
// with on either device.
//
// This is the ground truth every accuracy claim is measured against.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "executor/tracking_allocator.h"

namespace shardfit::executor {

// True when `e` (or its message) is the meter's or LibTorch's out-of-memory
// error (the CUDA caching allocator's included, and cuBLAS failing to get
// its workspace).
bool is_out_of_memory(const std::exception& e);

// What the engine measures a run with, on either device. Figures are
// absolute (the engine subtracts what predates the run).
//   cpu   the TrackingAllocator (exact bytes; reserved = allocated: nothing
//         is cached); the limit is a byte budget on tracked bytes.
//   cuda  the CUDA caching allocator's statistics (CudaMeter); the limit is
//         its per-process memory fraction.
class DeviceMeter {
 public:
  virtual ~DeviceMeter() = default;
  virtual c10::Device device() const = 0;
  virtual int64_t allocated_bytes() const = 0;
  virtual int64_t reserved_bytes() const = 0;
  // Highest since the last reset_peak().
  virtual int64_t peak_allocated_bytes() const = 0;
  virtual int64_t peak_reserved_bytes() const = 0;
  // CUDA: cudaMalloc failed, the cache was flushed and the allocation
  // retried (fragmentation just short of an OOM), since reset_peak(). CPU: 0.
  virtual int64_t num_alloc_retries() const = 0;
  // Lets the run use a device of `device_bytes` from now on (0: no limit);
  // returns what the allocator may then hold in all. Past it an allocation
  // throws c10::OutOfMemoryError.
  //   cpu   tracked bytes above those live now <= device_bytes (the cpu
  //         profile has no overheads: the planner's budget is the same);
  //   cuda  a card of device_bytes in total: the caching allocator may
  //         reserve device_bytes minus what the process holds outside it
  //         now (context, NCCL, cuBLAS handles), as the planner charges a
  //         CUDA profile's overheads against --gpu-mem.
  // Throws std::invalid_argument when the device cannot be limited so
  // (larger than the card, or nothing left after the overheads).
  virtual int64_t limit_device_bytes(int64_t device_bytes) = 0;
  // Gives cached, unused device memory back (CUDA: emptyCache), so a
  // measurement starts from what live tensors need. CPU: nothing cached.
  virtual void release_cached() {}
  // Starts a new measurement: peaks := current, timeline cleared.
  virtual void reset_peak() = 0;
  // Records the end of a phase, with the reserved figures filled in.
  virtual void mark(const std::string& phase) = 0;
  virtual std::vector<TimelinePoint> timeline() const = 0;
  // The caching allocator's history (CUDA only; `run --allocator-history`,
  // which the CPU refuses before a meter exists): from the call on, every
  // alloc and free with its address, size and stream, each tagged with the
  // phase mark() closed last; written as reports/gpu/history's schema.
  virtual void record_allocator_history() { throw std::logic_error("this device has no allocator history"); }
  virtual void write_allocator_history(const std::string& /*path*/) const {
    throw std::logic_error("this device has no allocator history");
  }
};

// --device's rules, each with its one message, for run before any rank
// starts and for the engine and the meter where a caller reaches them
// directly: cpu or cuda; cuda only in a build against a CUDA LibTorch; and,
// for a rank's own device, an index among the cards it sees. Each throws
// std::invalid_argument.
//   parse_device: run's --device, "cpu" or "cuda" (each rank then takes
//     cuda:LOCAL_RANK), by the first two rules.
//   check_device: a rank's device, by all three.
c10::Device parse_device(const std::string& text);
void check_device(const c10::Device& device);

// The meter for `device`: the CPU's (TrackingAllocator::cpu(), installed on
// first use) or, in a build with a CUDA LibTorch, a CudaMeter on that GPU.
// Checks the device first (check_device).
std::unique_ptr<DeviceMeter> make_device_meter(c10::Device device);

// True when this build can run and meter CUDA devices (LibTorch with CUDA:
// SHARDFIT_CUDA_TORCH).
bool cuda_meter_built();

}  // namespace shardfit::executor
