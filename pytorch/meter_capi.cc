// The meter inside a real PyTorch process: a C ABI over the
// engine's own TrackingAllocator (executor/tracking_allocator.h), built as a
// shared library that Python loads with ctypes after `import torch`. That
// torch links the same LibTorch (libc10.so) this project builds against
// (.venv's, the pinned stack), so c10::SetCPUAllocator here replaces the CPU allocator of the
// PyTorch process itself: every storage PyTorch's DDP, ZeroRedundancyOptimizer,
// torch.utils.checkpoint and torch.optim allocate on the CPU is counted with
// the same rule as `shardfit run`'s reports (the requested nbytes).
//
// pytorch/shardfit_meter.py is the Python side; nothing else calls these.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include <c10/util/Exception.h>

#include "executor/tracking_allocator.h"

using shardfit::executor::TrackingAllocator;

namespace {

// What the allocator's observer does here: the watch below, then Python's
// observer (the allocation log) when one is set.
std::mutex g_mu;
std::condition_variable g_freed;
bool g_watching = false;
std::thread::id g_watcher;
std::unordered_set<const void*> g_watched;  // made on the watching thread, not yet freed
void (*g_python_observer)(const void* data, int64_t bytes) = nullptr;

void observe(const void* data, int64_t bytes) {
  void (*python)(const void*, int64_t) = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (bytes > 0) {
      if (g_watching && std::this_thread::get_id() == g_watcher) g_watched.insert(data);
    } else if (g_watched.erase(data) > 0) {
      g_freed.notify_all();
    }
    python = g_python_observer;
  }
  if (python) python(data, bytes);
}

}  // namespace

extern "C" {

// Installs the meter as LibTorch's CPU allocator (idempotent) and returns the
// bytes it counts as live now (0: storages made before it are not counted,
// and their frees are not subtracted).
int64_t shardfit_meter_install() { return TrackingAllocator::cpu().allocated_bytes(); }

int64_t shardfit_meter_allocated() { return TrackingAllocator::cpu().allocated_bytes(); }
int64_t shardfit_meter_peak() { return TrackingAllocator::cpu().peak_allocated_bytes(); }
int64_t shardfit_meter_num_allocs() { return TrackingAllocator::cpu().num_allocs(); }
// Peak := current; the timeline is cleared.
void shardfit_meter_reset_peak() { TrackingAllocator::cpu().reset_peak(); }
// 0 = no budget. Past it an allocation raises PyTorch's out-of-memory error.
void shardfit_meter_set_budget(int64_t bytes) { TrackingAllocator::cpu().set_budget_bytes(bytes); }

// Records the end of a phase named `label`.
void shardfit_meter_mark(const char* label) { TrackingAllocator::cpu().mark(label ? label : ""); }

// From now on `observer(data, bytes)` is called on every allocation
// (bytes > 0) and every release (bytes 0), on the thread that makes it; null
// stops it. pytorch/shardfit_meter.py's allocation log is its one user.
void shardfit_meter_set_observer(void (*observer)(const void* data, int64_t bytes)) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_python_observer = observer;
  }
  TrackingAllocator::set_observer(&observe);
}

// The watch: from shardfit_meter_watch_begin() on, the storages this thread
// allocates are noted; shardfit_meter_watch_settle(timeout_ms, ...) stops noting
// and waits (at most timeout_ms) until every noted storage is freed, on
// whichever thread frees it. Returns how many are still live then (0:
// settled), and sets *live_when_called (when not null) to how many were live
// before the wait. validate.py waits so around a synchronous collective on Gloo,
// whose worker thread may drop the finished work (and the storages it holds)
// after wait() has returned (docs/pytorch-validation.md, "Late frees").
void shardfit_meter_watch_begin() {
  TrackingAllocator::set_observer(&observe);
  std::lock_guard<std::mutex> lock(g_mu);
  g_watched.clear();
  g_watcher = std::this_thread::get_id();
  g_watching = true;
}

int64_t shardfit_meter_watch_settle(int64_t timeout_ms, int64_t* live_when_called) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_watching = false;
  if (live_when_called) *live_when_called = static_cast<int64_t>(g_watched.size());
  g_freed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [] { return g_watched.empty(); });
  const auto left = static_cast<int64_t>(g_watched.size());
  g_watched.clear();
  return left;
}

int64_t shardfit_meter_timeline_size() {
  return static_cast<int64_t>(TrackingAllocator::cpu().timeline().size());
}

// Point `i` of the timeline: its label (NUL-terminated, cut to label_cap - 1
// bytes), the bytes live when it was taken and the peak since the point
// before. Returns 0, or -1 when `i` is out of range.
int shardfit_meter_timeline_point(int64_t i, char* label, int64_t label_cap, int64_t* allocated, int64_t* peak) {
  const auto timeline = TrackingAllocator::cpu().timeline();
  if (i < 0 || i >= static_cast<int64_t>(timeline.size())) return -1;
  const auto& p = timeline[static_cast<size_t>(i)];
  if (label && label_cap > 0) {
    const size_t n = std::min(p.label.size(), static_cast<size_t>(label_cap - 1));
    std::memcpy(label, p.label.data(), n);
    label[n] = '\0';
  }
  if (allocated) *allocated = p.allocated_bytes;
  if (peak) *peak = p.peak_allocated_bytes;
  return 0;
}

}  // extern "C"
