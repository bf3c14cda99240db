#include "planner/allocator_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardfit::planner {
namespace {

// c10/cuda/CUDACachingAllocator.cpp (PyTorch 1.12-2.x):
// kMinBlockSize: "all sizes are rounded to at least 512 bytes".
constexpr int64_t kMinBlockSize = 512;
// kSmallSize: "largest 'small' allocation is 1 MiB".
constexpr int64_t kSmallSize = 1 << 20;
// kSmallBuffer: "'small' allocations are packed in 2 MiB blocks".
constexpr int64_t kSmallBuffer = 2 << 20;
// kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks".
constexpr int64_t kLargeBuffer = 20 << 20;
// kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer".
constexpr int64_t kMinLargeAlloc = 10 << 20;
// kRoundLarge: "round up large allocations to 2 MiB".
constexpr int64_t kRoundLarge = 2 << 20;

// id_block_ value of an id that is live but has no block: PyTorch hands out
// nullptr for a 0-byte request without touching its pools.
constexpr int32_t kEmptyBlock = -2;

int64_t normalized_budget(int64_t budget_bytes) {
  if (budget_bytes < 0) {
    throw std::invalid_argument("allocator budget " + std::to_string(budget_bytes) +
                                " bytes is negative; use 0 for unlimited");
  }
  return budget_bytes == 0 ? kUnlimitedBytes : budget_bytes;
}

void check_new_id(int64_t id, int64_t bytes) {
  if (id < 0) throw std::invalid_argument("allocator id " + std::to_string(id) + " is negative");
  if (bytes < 0) {
    throw std::invalid_argument("allocation of " + std::to_string(bytes) + " bytes for id " +
                                std::to_string(id) + " is negative");
  }
}

}  // namespace

AllocatorModel::AllocatorModel(int64_t budget_bytes)
    : budget_bytes_(normalized_budget(budget_bytes)) {}

void AllocatorModel::reset_counters() {
  allocated_bytes_ = reserved_bytes_ = 0;
  peak_allocated_bytes_ = peak_reserved_bytes_ = 0;
  num_alloc_retries_ = 0;
}

void AllocatorModel::note_peaks() {
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  peak_reserved_bytes_ = std::max(peak_reserved_bytes_, reserved_bytes_);
}

// ---------------------------------------------------------------- exact

ExactAllocator::ExactAllocator(int64_t budget_bytes) : AllocatorModel(budget_bytes) {}

bool ExactAllocator::alloc(int64_t id, int64_t bytes, int /*stream*/) {
  check_new_id(id, bytes);
  if (id >= static_cast<int64_t>(live_bytes_.size())) live_bytes_.resize(id + 1, -1);
  if (live_bytes_[id] >= 0)
    throw std::logic_error("allocator id " + std::to_string(id) + " is already live");
  if (bytes > budget_bytes_ - allocated_bytes_) return false;
  live_bytes_[id] = bytes;
  allocated_bytes_ += bytes;
  reserved_bytes_ = allocated_bytes_;
  note_peaks();
  return true;
}

void ExactAllocator::free(int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(live_bytes_.size()) || live_bytes_[id] < 0) return;
  allocated_bytes_ -= live_bytes_[id];
  reserved_bytes_ = allocated_bytes_;
  live_bytes_[id] = -1;
}

void ExactAllocator::reset() {
  reset_counters();
  std::fill(live_bytes_.begin(), live_bytes_.end(), -1);
}

int64_t ExactAllocator::charged_bytes(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(live_bytes_.size())) return 0;
  return std::max<int64_t>(live_bytes_[id], 0);
}

// ---------------------------------------------------------------- CUDA

bool CudaCachingAllocatorModel::FreeKey::operator<(const FreeKey& o) const {
  if (stream != o.stream) return stream < o.stream;
  if (size != o.size) return size < o.size;
  return address < o.address;
}

CudaCachingAllocatorModel::CudaCachingAllocatorModel(int64_t budget_bytes)
    : AllocatorModel(budget_bytes) {}

// round_size(): every request is a multiple of 512 B, at least 512 B.
int64_t CudaCachingAllocatorModel::round_size(int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

// get_allocation_size(): how big a segment a cache miss reserves.
int64_t CudaCachingAllocatorModel::segment_size(int64_t rounded_bytes) {
  if (rounded_bytes <= kSmallSize) return kSmallBuffer;
  if (rounded_bytes < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded_bytes + kRoundLarge - 1) / kRoundLarge);
}

bool CudaCachingAllocatorModel::is_small(int64_t rounded_bytes) {
  return rounded_bytes <= kSmallSize;
}

CudaCachingAllocatorModel::FreeKey CudaCachingAllocatorModel::key_of(int32_t b) const {
  const Block& blk = blocks_[b];
  return FreeKey{blk.stream, blk.size, blk.address, b};
}

void CudaCachingAllocatorModel::insert_free(int32_t b) {
  FreeSet& p = pool(blocks_[b].small);
  if (spare_nodes_.empty()) {
    blocks_[b].cached = p.insert(key_of(b)).first;
    return;
  }
  FreeSet::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.value() = key_of(b);
  blocks_[b].cached = p.insert(std::move(node)).position;
}

void CudaCachingAllocatorModel::erase_free(int32_t b) {
  // cached blocks are always indexed, at `cached`
  spare_nodes_.push_back(pool(blocks_[b].small).extract(blocks_[b].cached));
}

// get_free_block(): the smallest cached block of this pool and stream that is
// large enough; ties go to the lower address.
int32_t CudaCachingAllocatorModel::find_free(bool small, int stream, int64_t rounded) const {
  const auto& p = small ? small_free_ : large_free_;
  auto it = p.lower_bound(FreeKey{stream, rounded, 0, -1});
  if (it == p.end() || it->stream != stream) return -1;
  return it->block;
}

int32_t CudaCachingAllocatorModel::new_block() {
  if (!spare_blocks_.empty()) {
    int32_t b = spare_blocks_.back();
    spare_blocks_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.emplace_back();
  return static_cast<int32_t>(blocks_.size() - 1);
}

void CudaCachingAllocatorModel::release_block(int32_t b) {
  reserved_bytes_ -= blocks_[b].size;
  --num_segments_;
  spare_blocks_.push_back(b);
}

// A cached block with no neighbours is a whole segment nobody uses: the only
// thing release_cached_blocks() can hand back to the device.
int64_t CudaCachingAllocatorModel::releasable_bytes() const {
  int64_t total = 0;
  for (const auto* p : {&small_free_, &large_free_}) {
    for (const FreeKey& k : *p) {
      const Block& blk = blocks_[k.block];
      if (blk.prev < 0 && blk.next < 0) total += blk.size;
    }
  }
  return total;
}

// release_cached_blocks(): both pools, every stream.
void CudaCachingAllocatorModel::release_cached_segments() {
  for (auto* p : {&small_free_, &large_free_}) {
    for (auto it = p->begin(); it != p->end();) {
      const Block& blk = blocks_[it->block];
      if (blk.prev < 0 && blk.next < 0) {
        release_block(it->block);
        it = p->erase(it);
      } else {
        ++it;
      }
    }
  }
}

// A new request for `id`: checked, and false when it is already served, as
// a 0-byte one is (PyTorch hands out nullptr without touching its pools).
bool CudaCachingAllocatorModel::start_alloc(int64_t id, int64_t bytes) {
  check_new_id(id, bytes);
  if (id >= static_cast<int64_t>(id_block_.size())) id_block_.resize(id + 1, -1);
  if (id_block_[id] != -1)
    throw std::logic_error("allocator id " + std::to_string(id) + " is already live");
  if (bytes > 0) return true;
  id_block_[id] = kEmptyBlock;
  return false;
}

// alloc_block(): a new segment, one cached-to-be block.
int32_t CudaCachingAllocatorModel::reserve_segment(int64_t address, int64_t size, int stream, bool small) {
  const int32_t b = new_block();
  Block& blk = blocks_[b];
  blk.address = address;
  blk.size = size;
  blk.stream = stream;
  blk.small = small;
  reserved_bytes_ += size;
  ++num_segments_;
  return b;
}

// alloc_found_block(): hand out block `b` for `rounded` bytes.
// should_split(): small blocks split when at least one 512 B block remains,
// large ones only when more than kSmallSize remains (max_split_size
// unlimited); an unsplit remainder stays inside the allocated block.
void CudaCachingAllocatorModel::take_block(int64_t id, int32_t b, int64_t rounded) {
  const int64_t remaining = blocks_[b].size - rounded;
  if (blocks_[b].small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    const int32_t r = new_block();  // may reallocate blocks_: index only
    Block& rest = blocks_[r];
    Block& blk = blocks_[b];
    rest.address = blk.address + rounded;
    rest.size = remaining;
    rest.stream = blk.stream;
    rest.small = blk.small;
    rest.prev = b;
    rest.next = blk.next;
    if (blk.next >= 0) blocks_[blk.next].prev = r;
    blk.next = r;
    blk.size = rounded;
    insert_free(r);
  }
  blocks_[b].allocated = true;
  allocated_bytes_ += blocks_[b].size;
  id_block_[id] = b;
  note_peaks();
}

bool CudaCachingAllocatorModel::alloc(int64_t id, int64_t bytes, int stream) {
  if (!start_alloc(id, bytes)) return true;
  const int64_t rounded = round_size(bytes);
  const bool small = is_small(rounded);
  int32_t b = find_free(small, stream, rounded);
  if (b >= 0) {
    erase_free(b);
  } else {
    // Cache miss: reserve a new segment (alloc_block()).
    const int64_t seg = segment_size(rounded);
    if (seg > budget_bytes_ - reserved_bytes_) {
      // Over the budget: PyTorch empties its cache and retries once; decide
      // up front whether that can succeed so that an OOM changes nothing.
      if (seg > budget_bytes_ - (reserved_bytes_ - releasable_bytes())) return false;
      release_cached_segments();
      ++num_alloc_retries_;
    }
    b = reserve_segment(next_address_, seg, stream, small);
    next_address_ += seg;
  }
  take_block(id, b, rounded);
  return true;
}

int64_t CudaCachingAllocatorModel::choose(int64_t bytes, int stream) const {
  const int64_t rounded = round_size(bytes);
  const int32_t b = find_free(is_small(rounded), stream, rounded);
  return b < 0 ? -1 : blocks_[b].address;
}

bool CudaCachingAllocatorModel::alloc_at(int64_t id, int64_t bytes, int stream, int64_t address, bool new_segment) {
  if (!start_alloc(id, bytes)) return true;
  const int64_t rounded = round_size(bytes);
  const bool small = is_small(rounded);
  if (new_segment) {
    const int64_t seg = segment_size(rounded);
    if (seg > budget_bytes_ - reserved_bytes_) return false;
    take_block(id, reserve_segment(address, seg, stream, small), rounded);
    return true;
  }
  for (const FreeKey& k : pool(small)) {
    if (k.address != address) continue;
    if (k.stream != stream || k.size < rounded) return false;
    const int32_t b = k.block;
    erase_free(b);
    take_block(id, b, rounded);
    return true;
  }
  return false;
}

void CudaCachingAllocatorModel::adopt_segment(int64_t address, bool small, int stream,
                                              const std::vector<Piece>& pieces) {
  int32_t prev = -1;
  int64_t at = address;
  for (const Piece& p : pieces) {
    if (p.bytes <= 0 || p.bytes % kMinBlockSize != 0) {
      throw std::invalid_argument("adopted block of " + std::to_string(p.bytes) +
                                  " bytes is not a positive multiple of 512");
    }
    if (p.id < 0 && prev >= 0 && !blocks_[prev].allocated) {  // merges with the cached block before it
      blocks_[prev].size += p.bytes;
      at += p.bytes;
      continue;
    }
    if (p.id >= 0) start_alloc(p.id, p.bytes);  // p.bytes > 0: it gets the block below
    const int32_t b = new_block();
    Block& blk = blocks_[b];
    blk.address = at;
    blk.size = p.bytes;
    blk.stream = stream;
    blk.small = small;
    blk.prev = prev;
    blk.allocated = p.id >= 0;
    if (prev >= 0) blocks_[prev].next = b;
    if (blk.allocated) {
      id_block_[p.id] = b;
      allocated_bytes_ += p.bytes;
    }
    at += p.bytes;
    prev = b;
  }
  for (int32_t b = prev; b >= 0; b = blocks_[b].prev) {
    if (!blocks_[b].allocated) insert_free(b);
  }
  reserved_bytes_ += at - address;
  ++num_segments_;
  note_peaks();
}

void CudaCachingAllocatorModel::free(int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(id_block_.size()) || id_block_[id] == -1) return;
  int32_t b = id_block_[id];
  id_block_[id] = -1;
  if (b == kEmptyBlock) return;
  blocks_[b].allocated = false;
  allocated_bytes_ -= blocks_[b].size;
  // free_block() / try_merge_blocks(): absorb free neighbours of the segment.
  const int32_t prev = blocks_[b].prev;
  if (prev >= 0 && !blocks_[prev].allocated) {
    erase_free(prev);
    Block& blk = blocks_[b];
    blk.address = blocks_[prev].address;
    blk.size += blocks_[prev].size;
    blk.prev = blocks_[prev].prev;
    if (blk.prev >= 0) blocks_[blk.prev].next = b;
    spare_blocks_.push_back(prev);
  }
  const int32_t next = blocks_[b].next;
  if (next >= 0 && !blocks_[next].allocated) {
    erase_free(next);
    Block& blk = blocks_[b];
    blk.size += blocks_[next].size;
    blk.next = blocks_[next].next;
    if (blk.next >= 0) blocks_[blk.next].prev = b;
    spare_blocks_.push_back(next);
  }
  insert_free(b);
}

void CudaCachingAllocatorModel::reset() {
  reset_counters();
  blocks_.clear();
  spare_blocks_.clear();
  small_free_.clear();
  large_free_.clear();
  std::fill(id_block_.begin(), id_block_.end(), -1);
  next_address_ = 0;
  num_segments_ = 0;
}

int64_t CudaCachingAllocatorModel::charged_bytes(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(id_block_.size())) return 0;
  const int32_t b = id_block_[id];
  return b < 0 ? 0 : blocks_[b].size;
}

int64_t CudaCachingAllocatorModel::address_of(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(id_block_.size())) return -1;
  const int32_t b = id_block_[id];
  return b < 0 ? -1 : blocks_[b].address;
}

}  // namespace shardfit::planner
