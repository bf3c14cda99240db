// The CUDA meter (see cuda_meter.h): the caching allocator's device stats,
// a memory fraction as the budget, a timeline at phase marks.
#include "executor/cuda_meter.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

namespace shardfit::executor {

namespace {

// LibTorch 1.13 and 2.x differ here only in spelling, which the calls below
// avoid needing #ifs for:
//  - StatType::AGGREGATE (every pool) is index 0 in every version; the enum
//    moved from c10::cuda::CUDACachingAllocator (1.x) to
//    c10::CachingAllocator (2.x), the index did not;
//  - getDeviceStats returns CUDACachingAllocator::DeviceStats (1.x) or
//    c10::CachingDeviceAllocator::DeviceStats (2.x) with the same fields
//    (allocated_bytes, reserved_bytes, allocation: StatArrays of
//    {current, peak, allocated, freed}; num_alloc_retries, num_ooms): auto;
//  - device arguments are int (1.x) or c10::DeviceIndex (2.x): we pass a
//    DeviceIndex, which converts to either;
//  - emptyCache() gained a defaulted mempool argument in 2.x.
constexpr size_t kAggregate = 0;

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string first_line(const std::string& what) {
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

// c10's recordHistory and setUserMetadata, as LibTorch 2.11 declares them.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
#define SHARDFIT_ALLOCATOR_HISTORY 1
namespace cca = c10::cuda::CUDACachingAllocator;

// The names torch.cuda.memory._snapshot() gives TraceEntry's actions.
const char* action_name(cca::TraceEntry::Action a) {
  switch (a) {
    case cca::TraceEntry::ALLOC: return "alloc";
    case cca::TraceEntry::FREE_REQUESTED: return "free_requested";
    case cca::TraceEntry::FREE_COMPLETED: return "free_completed";
    case cca::TraceEntry::SEGMENT_ALLOC: return "segment_alloc";
    case cca::TraceEntry::SEGMENT_FREE: return "segment_free";
    case cca::TraceEntry::SEGMENT_MAP: return "segment_map";
    case cca::TraceEntry::SEGMENT_UNMAP: return "segment_unmap";
    case cca::TraceEntry::SNAPSHOT: return "snapshot";
    case cca::TraceEntry::OOM: return "oom";
  }
  return "unknown";
}

// A snapshot's segments on `device`, each with its blocks in address order.
nlohmann::json segments_json(const cca::SnapshotInfo& snap, int device) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& seg : snap.segments) {
    if (seg.device != device) continue;
    nlohmann::json blocks = nlohmann::json::array();
    for (const auto& b : seg.blocks) {
      blocks.push_back({{"size", b.size}, {"requested_size", b.requested_size}, {"allocated", b.allocated}});
    }
    out.push_back({{"address", seg.address},
                   {"total_size", seg.total_size},
                   {"segment_type", seg.is_large ? "large" : "small"},
                   {"allocated_size", seg.allocated_size},
                   {"stream", reinterpret_cast<uintptr_t>(seg.stream)},
                   {"blocks", std::move(blocks)}});
  }
  return out;
}
#endif

}  // namespace

CudaMeter::CudaMeter(int device) {
  if (c10::cuda::device_count() == 0) throw std::runtime_error("CudaMeter: no CUDA device is visible");
  device_ = device < 0 ? static_cast<int>(c10::cuda::current_device()) : device;
  if (device_ >= static_cast<int>(c10::cuda::device_count()))
    throw std::runtime_error("CudaMeter: cuda:" + std::to_string(device_) + " is not visible");
  // The allocator of a device exists once LibTorch has initialised CUDA;
  // one tiny tensor does that in every version (1.13 lazyInitCUDA, 2.x
  // lazyInitDevice). Its 2 MiB segment goes back at once.
  { at::Tensor t = at::empty({1}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_)); }
  release_cached();
  reset_peak();
}

c10::Device CudaMeter::device() const {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_));
}

CudaMeter::Stats CudaMeter::read() const {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
  Stats st;
  st.allocated = s.allocated_bytes[kAggregate].current;
  st.peak_allocated = s.allocated_bytes[kAggregate].peak;
  st.reserved = s.reserved_bytes[kAggregate].current;
  st.peak_reserved = s.reserved_bytes[kAggregate].peak;
  st.allocs = s.allocation[kAggregate].allocated;
  st.retries = s.num_alloc_retries;
  st.ooms = s.num_ooms;
  return st;
}

int64_t CudaMeter::allocated_bytes() const { return read().allocated; }
int64_t CudaMeter::reserved_bytes() const { return read().reserved; }

int64_t CudaMeter::peak_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(peak_allocated_, read().peak_allocated);
}

int64_t CudaMeter::peak_reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(peak_reserved_, read().peak_reserved);
}

int64_t CudaMeter::num_allocs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read().allocs - base_allocs_;
}

int64_t CudaMeter::num_alloc_retries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read().retries - base_retries_;
}

int64_t CudaMeter::num_ooms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read().ooms - base_ooms_;
}

int64_t CudaMeter::device_total_bytes() const {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  size_t free = 0, total = 0;
  cudaError_t e = cudaMemGetInfo(&free, &total);
  if (e != cudaSuccess) throw std::runtime_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
  return static_cast<int64_t>(total);
}

int64_t CudaMeter::device_free_bytes() const {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  size_t free = 0, total = 0;
  cudaError_t e = cudaMemGetInfo(&free, &total);
  if (e != cudaSuccess) throw std::runtime_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
  return static_cast<int64_t>(free);
}

// cudaMemGetInfo is the whole card's: memory of other processes on the same
// card counts here too, so a measurement wants the card to itself.
int64_t CudaMeter::outside_allocator_bytes() const {
  return device_total_bytes() - device_free_bytes() - reserved_bytes();
}

void CudaMeter::set_budget_bytes(int64_t budget) {
  const int64_t total = device_total_bytes();
  if (budget < 0 || budget > total)
    throw std::invalid_argument("--gpu-mem " + std::to_string(budget) + " bytes: must be in 0.." +
                                std::to_string(total) + " (cuda:" + std::to_string(device_) + " has " + gib(total) +
                                ")");
  // The allocator caps reserved at fraction x the total cudaMemGetInfo
  // reports: the same total as here, so the cap is `budget` (to a byte;
  // segments are whole 2 MiB pages anyway).
  const double fraction = budget == 0 ? 1.0 : static_cast<double>(budget) / static_cast<double>(total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device_));
  budget_ = budget;
}

int64_t CudaMeter::set_device_memory_bytes(int64_t card_bytes) {
  const int64_t outside = outside_allocator_bytes();
  const int64_t budget = card_bytes - outside;
  if (budget <= 0)
    throw std::invalid_argument("--gpu-mem " + gib(card_bytes) + ": " + gib(outside) +
                                " of the card is already held outside this process's caching allocator (its context, "
                                "NCCL, libraries, or other processes on the card); nothing would be left");
  set_budget_bytes(budget);
  return budget;
}

int64_t CudaMeter::limit_device_bytes(int64_t device_bytes) {
  if (device_bytes == 0) {
    set_budget_bytes(0);
    return 0;
  }
  return set_device_memory_bytes(device_bytes);
}

void CudaMeter::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
  const Stats s = read();
  peak_allocated_ = s.allocated;
  peak_reserved_ = s.reserved;
  base_allocs_ = s.allocs;
  base_retries_ = s.retries;
  base_ooms_ = s.ooms;
  timeline_.clear();
  last_oom_.reset();
}

void CudaMeter::mark(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  const Stats s = read();
  TimelinePoint p;
  p.label = phase;
  p.allocated_bytes = s.allocated;
  p.peak_allocated_bytes = s.peak_allocated;
  p.reserved_bytes = s.reserved;
  p.peak_reserved_bytes = s.peak_reserved;
  timeline_.push_back(p);
  peak_allocated_ = std::max(peak_allocated_, s.peak_allocated);
  peak_reserved_ = std::max(peak_reserved_, s.peak_reserved);
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
#ifdef SHARDFIT_ALLOCATOR_HISTORY
  if (recording_history_) cca::setUserMetadata(phase);  // the events from here on come after `phase`
#endif
}

void CudaMeter::record_allocator_history() {
#ifdef SHARDFIT_ALLOCATOR_HISTORY
  std::lock_guard<std::mutex> lock(mu_);
  // The segments held now, block by block: the state the trace starts from.
  start_segments_ = segments_json(cca::snapshot(), device_).dump();
  // No stacks (RecordContext::NEVER): the phase tag says where an event is.
  cca::recordHistory(true, nullptr, 1000000, cca::RecordContext::NEVER, true, {});
  cca::setUserMetadata("");
  recording_history_ = true;
#else
  throw std::runtime_error("--allocator-history: needs LibTorch 2.11 or later");
#endif
}

void CudaMeter::write_allocator_history(const std::string& path) const {
#ifdef SHARDFIT_ALLOCATOR_HISTORY
  const cca::SnapshotInfo snap = cca::snapshot();
  nlohmann::json events = nlohmann::json::array();
  if (device_ < static_cast<int>(snap.device_traces.size())) {
    for (const auto& e : snap.device_traces[device_]) {
      events.push_back({{"action", action_name(e.action_)},
                        {"addr", e.addr_},
                        {"size", e.size_},
                        {"stream", reinterpret_cast<uintptr_t>(e.stream_)},
                        {"after", e.user_metadata_}});
    }
  }
  const nlohmann::json out = {{"schema", "shardfit.allocator-history/1"},
                              {"start_segments", nlohmann::json::parse(start_segments_)},
                              {"events", std::move(events)},
                              {"segments", segments_json(snap, device_)}};
  std::ofstream f(path);
  f << out.dump() << "\n";
  if (!f) throw std::runtime_error("--allocator-history " + path + ": cannot write");
#else
  (void)path;
  throw std::runtime_error("--allocator-history: needs LibTorch 2.11 or later");
#endif
}

std::vector<TimelinePoint> CudaMeter::timeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeline_;
}

std::optional<CudaOutOfMemory> CudaMeter::run_catching_oom(const std::function<void()>& step) {
  try {
    step();
    return std::nullopt;
  } catch (const c10::Error& e) {
    // c10::OutOfMemoryError from the allocator, or a library's allocation
    // failure that says so (cuBLAS workspace, ...).
    if (!is_out_of_memory(e)) throw;
    CudaOutOfMemory oom;
    oom.message = first_line(e.what_without_backtrace());
    const Stats s = read();
    oom.allocated_bytes = s.allocated;
    oom.reserved_bytes = s.reserved;
    oom.budget_bytes = budget_;
    mark("oom");
    std::lock_guard<std::mutex> lock(mu_);
    last_oom_ = oom;
    return oom;
  }
}

void CudaMeter::release_cached() { c10::cuda::CUDACachingAllocator::emptyCache(); }

}  // namespace shardfit::executor
