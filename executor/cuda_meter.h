// The CUDA meter: what a rank really used on its GPU, read from LibTorch's
// CUDA caching allocator (c10::cuda::CUDACachingAllocator's device stats):
// allocated bytes (live tensors' blocks, rounded as the allocator rounds
// them), reserved bytes (segments held from cudaMalloc, used or cached),
// their peaks, and num_alloc_retries (cudaMalloc failed, the cache was
// flushed and the allocation retried: fragmentation pressure just short of
// an OOM). It is the engine's DeviceMeter on CUDA (meter.h: the same
// figures and timeline as on the CPU, plus the reserved figures, which
// decide OOM on CUDA).
//
// Budget (--gpu-mem): the caching allocator's memory fraction, cap = bytes /
// the card's total (setMemoryFraction). Past it an allocation throws
// c10::OutOfMemoryError exactly as on a card of that size: one H200 stands
// in for a 24 GB card. The fraction caps *reserved*, not what the process
// holds outside the allocator (CUDA context, NCCL's buffers, library
// handles): set_device_memory_bytes subtracts what is outside now, to
// emulate a card whose total is that many bytes.
//
// The statistics are the allocator's host-side bookkeeping (an allocation
// is counted when the host asks for it, which is also when OOM is decided),
// so reading them needs no device synchronisation.
//
// Built and linked only when LibTorch has CUDA (SHARDFIT_CUDA_TORCH); where
// LibTorch is CPU-only but ships the c10/cuda headers (Debian) the CUDA
// compile check (cmake/ShardfitCuda.cmake) compiles it without linking.
// This header itself needs no CUDA include.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "executor/meter.h"

namespace shardfit::executor {

// What the allocator said when a step ran out of memory.
struct CudaOutOfMemory {
  std::string message;  // c10::OutOfMemoryError's first line
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t budget_bytes = 0;  // 0: the whole card
};

class CudaMeter final : public DeviceMeter {
 public:
  // Meters `device` (-1: the current CUDA device). Initialises LibTorch's
  // CUDA state for it (the allocator must exist before its fraction is set)
  // and returns the cached memory that costs, so the meter starts clean.
  // Throws std::runtime_error when no CUDA device is visible.
  explicit CudaMeter(int device = -1);

  int device_index() const { return device_; }
  c10::Device device() const override;

  // Live figures.
  int64_t allocated_bytes() const override;
  int64_t reserved_bytes() const override;
  // Highest since the last reset_peak().
  int64_t peak_allocated_bytes() const override;
  int64_t peak_reserved_bytes() const override;
  // Allocations asked of the allocator, cudaMalloc retries after a cache
  // flush, and OOMs, since the last reset_peak().
  int64_t num_allocs() const;
  int64_t num_alloc_retries() const override;
  int64_t num_ooms() const;

  // The card: total and free bytes (cudaMemGetInfo).
  int64_t device_total_bytes() const;
  int64_t device_free_bytes() const;
  // What this process (and any other on the card) holds outside the caching
  // allocator: total - free - reserved. Context, NCCL, library handles.
  int64_t outside_allocator_bytes() const;

  // Caps the allocator's reserved bytes at `budget` (fraction budget /
  // total); 0 removes the cap. Throws std::invalid_argument when it is
  // larger than the card or negative.
  void set_budget_bytes(int64_t budget);
  int64_t budget_bytes() const { return budget_; }
  // Emulates a card of `card_bytes` in total: the allocator may reserve
  // card_bytes - outside_allocator_bytes() (measured now; call it after the
  // communicator has run a collective, when NCCL's buffers exist). Returns
  // the budget set. Throws std::invalid_argument when nothing would be left.
  int64_t set_device_memory_bytes(int64_t card_bytes);
  // DeviceMeter's limit: set_device_memory_bytes, or no cap for 0.
  int64_t limit_device_bytes(int64_t device_bytes) override;

  // Starts a new measurement: peaks := current, counters zeroed, timeline
  // cleared. Resets the allocator's own peak statistics.
  void reset_peak() override;
  // Records the end of a phase (the CPU meter's names: "init",
  // "step1/forward/unit3", ...). Resets the allocator's peaks, so each
  // point's peaks cover the time since the previous point.
  void mark(const std::string& phase) override;
  std::vector<TimelinePoint> timeline() const override;
  // The allocator's own trace (c10's recordHistory, as
  // torch.cuda.memory._record_memory_history; LibTorch 2.11+), tagged per
  // phase with setUserMetadata. The JSON holds the segments when recording
  // began, with their blocks, so a replay needs no guess (the schema's
  // "start_segments"), and the segments at the end.
  void record_allocator_history() override;
  void write_allocator_history(const std::string& path) const override;

  // Runs `step`. A c10::OutOfMemoryError from it is recorded (a timeline
  // point "oom", the allocator's figures, the message) and returned instead
  // of thrown; the caller then drops its tensors and may call
  // release_cached(). Other exceptions propagate.
  std::optional<CudaOutOfMemory> run_catching_oom(const std::function<void()>& step);
  // The last OOM recorded, if any, since reset_peak().
  const std::optional<CudaOutOfMemory>& last_oom() const { return last_oom_; }

  // Hands the allocator's unused cached segments back to the driver
  // (emptyCache): reserved drops to what live tensors need.
  void release_cached() override;

 private:
  struct Stats {
    int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
    int64_t allocs = 0, retries = 0, ooms = 0;
  };
  Stats read() const;

  int device_ = 0;
  int64_t budget_ = 0;
  // Peaks up to the last mark (the allocator's own peaks cover the time since).
  int64_t peak_allocated_ = 0;
  int64_t peak_reserved_ = 0;
  // Counter values at the last reset_peak().
  int64_t base_allocs_ = 0, base_retries_ = 0, base_ooms_ = 0;
  mutable std::mutex mu_;
  std::vector<TimelinePoint> timeline_;
  std::optional<CudaOutOfMemory> last_oom_;
  bool recording_history_ = false;
  std::string start_segments_;  // JSON, when the history began
};

}  // namespace shardfit::executor
