// Virtual device allocators for the step simulator. They deal only in ids,
// sizes and offsets, never in memory (as ggml-alloc does): the simulator asks
// for `bytes` under an `id` on a `stream`, and the model says what that really
// costs on the device (rounding, segments, cached blocks) and whether it fits
// under the budget. Two models:
//  - ExactAllocator: the CPU executor's tracking allocator, which counts the
//    requested nbytes exactly and raises OOM past its budget.
//  - CudaCachingAllocatorModel: PyTorch's CUDA caching allocator
//    (c10/cuda/CUDACachingAllocator.cpp, 1.12-2.x, default settings: no
//    expandable segments, max_split_size unlimited, no roundup_power2).
//
// Ids are small non-negative integers (the simulator numbers its buffers
// densely): the models index per-id state by id, so an id of 10^9 costs
// 10^9 slots. Allocating a live id is a logic error; freeing an id that is not
// live is a no-op.
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

namespace shardfit::planner {

// A budget of 0 or kUnlimitedBytes means no limit.
inline constexpr int64_t kUnlimitedBytes = std::numeric_limits<int64_t>::max();

class AllocatorModel {
 public:
  explicit AllocatorModel(int64_t budget_bytes);
  virtual ~AllocatorModel() = default;

  // Allocates `bytes` (>= 0) under `id` on `stream` (0 = compute,
  // 1 = communication). Returns false, leaving the state unchanged, when the
  // allocation would take the device past the budget (an OOM).
  virtual bool alloc(int64_t id, int64_t bytes, int stream) = 0;
  // Frees `id`; a no-op when `id` is not live.
  virtual void free(int64_t id) = 0;
  // Back to the empty state (peaks and retry count too); the budget stays.
  virtual void reset() = 0;
  // What `id` costs in allocated_bytes() (0 when not live): the requested
  // bytes for the exact model, the block size for the caching model.
  virtual int64_t charged_bytes(int64_t id) const = 0;
  // The size an out-of-memory error names for a request of `bytes` (what
  // PyTorch's "Tried to allocate" prints): the request itself, or for the
  // caching allocator the segment it would reserve.
  virtual int64_t allocation_size(int64_t bytes) const { return bytes; }

  int64_t budget_bytes() const { return budget_bytes_; }
  // Bytes handed out to live ids, as the allocator counts them.
  int64_t allocated_bytes() const { return allocated_bytes_; }
  // Bytes the allocator holds from the device (segments, for CUDA).
  int64_t reserved_bytes() const { return reserved_bytes_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_bytes_; }
  int64_t peak_reserved_bytes() const { return peak_reserved_bytes_; }
  // Times the allocator had to empty its cache to satisfy a request
  // (torch.cuda.memory_stats()["num_alloc_retries"]).
  int64_t num_alloc_retries() const { return num_alloc_retries_; }

 protected:
  void reset_counters();
  void note_peaks();

  int64_t budget_bytes_;
  int64_t allocated_bytes_ = 0;
  int64_t reserved_bytes_ = 0;
  int64_t peak_allocated_bytes_ = 0;
  int64_t peak_reserved_bytes_ = 0;
  int64_t num_alloc_retries_ = 0;
};

// allocated == reserved == sum of live requested bytes; OOM when that sum
// would exceed the budget.
class ExactAllocator final : public AllocatorModel {
 public:
  explicit ExactAllocator(int64_t budget_bytes = kUnlimitedBytes);
  bool alloc(int64_t id, int64_t bytes, int stream) override;
  void free(int64_t id) override;
  void reset() override;
  int64_t charged_bytes(int64_t id) const override;

 private:
  std::vector<int64_t> live_bytes_;  // by id; -1 = not live
};

// PyTorch's caching allocator rules (see the .cc for each constant's source):
// 512 B rounding; a small pool (<= 1 MiB) carved from 2 MiB segments and a
// large pool carved from 20 MiB segments (requests < 10 MiB) or segments
// rounded up to 2 MiB; best fit among cached blocks of the same pool and
// stream; splitting and merging; on a miss a new segment, and when that would
// pass the budget, release every fully free cached segment (a "retry") and try
// again.
//
// allocated_bytes() counts block sizes, as PyTorch's allocated_bytes stat
// does: a block that was not split (remainder too small) is charged whole.
// reserved_bytes() is the sum of segment sizes and is what OOM is decided on
// (set_per_process_memory_fraction's check). On OOM this model leaves its
// state unchanged; PyTorch would already have emptied its cache, which nobody
// sees since the simulation stops at the first OOM.
class CudaCachingAllocatorModel final : public AllocatorModel {
 public:
  explicit CudaCachingAllocatorModel(int64_t budget_bytes = kUnlimitedBytes);
  bool alloc(int64_t id, int64_t bytes, int stream) override;
  void free(int64_t id) override;
  void reset() override;
  int64_t charged_bytes(int64_t id) const override;
  // CUDACachingAllocator.cpp malloc(): the OOM message formats alloc_size,
  // get_allocation_size(round_size(bytes)).
  int64_t allocation_size(int64_t bytes) const override { return segment_size(round_size(bytes)); }

  // The rules, exposed for tests and for callers that size buffers.
  static int64_t round_size(int64_t bytes);
  static int64_t segment_size(int64_t rounded_bytes);
  static bool is_small(int64_t rounded_bytes);
  // Virtual device address of a live id's block (segments get increasing,
  // never reused addresses); -1 when not live.
  int64_t address_of(int64_t id) const;
  // Number of segments currently reserved.
  int64_t num_segments() const { return num_segments_; }
  // emptyCache() / the retry's release_cached_blocks(): every segment no
  // live block uses goes back to the device.
  void empty_cache() { release_cached_segments(); }

  // Replaying a recorded history (torch.cuda.memory._record_memory_history):
  // the recording starts with segments already held, and the device, not the
  // allocator, chose each segment's address. A replay therefore adopts the
  // segments held before, places every block where the record says, and asks
  // the model only what it would have chosen.
  //
  // A piece of an adopted segment: `bytes` live under `id`, or cached (id -1).
  struct Piece {
    int64_t bytes = 0;
    int64_t id = -1;
  };
  // A segment held before the recording, at `address`, made of `pieces` in
  // address order (adjacent cached pieces merge, as free_block() would have).
  void adopt_segment(int64_t address, bool small, int stream, const std::vector<Piece>& pieces);
  // Where alloc(bytes, stream) would place the block now: the address of the
  // cached block it would take, or -1 when it would reserve a new segment.
  int64_t choose(int64_t bytes, int stream) const;
  // alloc() with the block's place given: a new segment at `address`, or the
  // cached block of this pool and stream that starts there. Returns false,
  // changing nothing, when there is no such cached block or it is too small,
  // or when a new segment would pass the budget (no retry: a replay places
  // what the record says).
  bool alloc_at(int64_t id, int64_t bytes, int stream, int64_t address, bool new_segment);

 private:
  // A cached (free) block in a pool's index, ordered as PyTorch's
  // BlockComparator: stream, then size, then address.
  struct FreeKey {
    int32_t stream;
    int64_t size;
    int64_t address;
    int32_t block;
    bool operator<(const FreeKey& o) const;
  };
  using FreeSet = std::set<FreeKey>;
  struct Block {
    int64_t address = 0;
    int64_t size = 0;
    int32_t prev = -1;  // neighbouring blocks of the same segment
    int32_t next = -1;
    int32_t stream = 0;
    bool small = false;
    bool allocated = false;
    FreeSet::iterator cached;  // its entry in its pool's index while cached
  };

  FreeSet& pool(bool small) { return small ? small_free_ : large_free_; }
  FreeKey key_of(int32_t b) const;
  void insert_free(int32_t b);
  void erase_free(int32_t b);
  int32_t find_free(bool small, int stream, int64_t rounded) const;
  int32_t new_block();
  int32_t reserve_segment(int64_t address, int64_t size, int stream, bool small);
  void take_block(int64_t id, int32_t b, int64_t rounded);
  bool start_alloc(int64_t id, int64_t bytes);
  void release_block(int32_t b);
  int64_t releasable_bytes() const;
  void release_cached_segments();

  std::vector<Block> blocks_;
  std::vector<int32_t> spare_blocks_;  // indices of unused Block slots
  // Ordered sets, not sorted vectors: thousands of cached blocks make a
  // vector's insert/erase (memmove) the simulator's hot spot. A block keeps
  // its entry's position (erased without a search) and erased entries'
  // nodes are reused (no heap allocation per free in a long replay).
  FreeSet small_free_;
  FreeSet large_free_;
  std::vector<FreeSet::node_type> spare_nodes_;
  std::vector<int32_t> id_block_;  // by id; -1 = not live
  int64_t next_address_ = 0;
  int64_t num_segments_ = 0;
};

}  // namespace shardfit::planner
