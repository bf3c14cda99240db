#include "executor/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <unordered_map>

namespace shardfit::executor {

namespace {
std::atomic<int> g_untracked_depth{0};
std::atomic<TrackingAllocator::Observer> g_observer{nullptr};

struct LiveBlock {
  int64_t bytes;  // 0 for an untracked block
  const TrackingAllocator* owner;
  c10::DeleterFnPtr base_deleter;
};
// Every live block of every TrackingAllocator, by address.
std::mutex g_blocks_mu;
std::unordered_map<void*, LiveBlock>& live_blocks() {
  static auto* blocks = new std::unordered_map<void*, LiveBlock>();  // outlives static storages
  return *blocks;
}
}  // namespace

TrackingAllocator::TrackingAllocator(c10::Allocator* base)
    : base_(base ? base : c10::GetDefaultCPUAllocator()) {}

TrackingAllocator& TrackingAllocator::cpu() {
  static TrackingAllocator* meter = [] {
    auto* m = new TrackingAllocator(c10::GetCPUAllocator());  // never freed: storages outlive main
    // Priority above LibTorch's own registration, so nothing replaces it.
    c10::SetCPUAllocator(m, /*priority=*/100);
    return m;
  }();
  return *meter;
}

static void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

void TrackingAllocator::on_alloc(int64_t now) const {
  raise_peak(peak_, now);
  raise_peak(peak_since_mark_, now);
  num_allocs_.fetch_add(1);
}

c10::DataPtr TrackingAllocator::allocate_tracked(size_t nbytes) const {
  const bool tracked = g_untracked_depth.load() == 0;
  const auto bytes = tracked ? static_cast<int64_t>(nbytes) : 0;
  const int64_t budget = budget_.load();
  int64_t now = 0;
  if (tracked) {
    // Reserve the bytes first (atomically under the budget, so two threads
    // cannot both pass), then allocate; give them back if that fails.
    int64_t seen = allocated_.load();
    do {
      if (budget > 0 && seen + bytes > budget) {
        C10_THROW_ERROR(OutOfMemoryError, "shardfit: out of memory: tried to allocate " +
                                              std::to_string(bytes) + " bytes with " +
                                              std::to_string(seen) + " of " +
                                              std::to_string(budget) + " budget bytes in use");
      }
    } while (!allocated_.compare_exchange_weak(seen, seen + bytes));
    now = seen + bytes;
  }
  void* data = nullptr;
  try {
    data = base_->raw_allocate(nbytes);
  } catch (...) {
    allocated_.fetch_sub(bytes);
    throw;
  }
  if (data == nullptr) {
    allocated_.fetch_sub(bytes);
  } else {
    {
      std::lock_guard<std::mutex> lock(g_blocks_mu);
      live_blocks()[data] = LiveBlock{bytes, this, base_->raw_deleter()};
    }
    if (tracked) on_alloc(now);
    if (auto observe = g_observer.load(); observe && bytes > 0) observe(data, bytes);
  }
  return {data, data, &TrackingAllocator::release, c10::Device(c10::DeviceType::CPU)};
}

void TrackingAllocator::release(void* data) {
  if (data == nullptr) return;
  LiveBlock block{};
  {
    std::lock_guard<std::mutex> lock(g_blocks_mu);
    auto it = live_blocks().find(data);
    if (it == live_blocks().end()) return;  // not ours: never happens for our DataPtrs
    block = it->second;
    live_blocks().erase(it);
  }
  block.owner->allocated_.fetch_sub(block.bytes);
  if (auto observe = g_observer.load(); observe && block.bytes > 0) observe(data, 0);
  block.base_deleter(data);
}

void TrackingAllocator::set_observer(Observer observer) { g_observer.store(observer); }

void TrackingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_.store(allocated_.load());
  peak_since_mark_.store(allocated_.load());
  timeline_.clear();
}

void TrackingAllocator::mark(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = allocated_.load();
  TimelinePoint p;
  p.label = phase;
  p.allocated_bytes = now;
  p.peak_allocated_bytes = peak_since_mark_.exchange(now);
  timeline_.push_back(p);
}

std::vector<TimelinePoint> TrackingAllocator::timeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeline_;
}

ScopedUntracked::ScopedUntracked() { g_untracked_depth.fetch_add(1); }
ScopedUntracked::~ScopedUntracked() { g_untracked_depth.fetch_sub(1); }

}  // namespace shardfit::executor
