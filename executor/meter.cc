#include "executor/meter.h"

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>
#include <torch/cuda.h>

#ifdef SHARDFIT_CUDA_TORCH
#include "executor/cuda_meter.h"
#endif

namespace shardfit::executor {

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const std::string what = e.what();
  // cuBLAS reports a workspace it could not get as a status, not an OOM.
  return what.find("out of memory") != std::string::npos ||
         what.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos;
}

namespace {

// The CPU's DeviceMeter: the process-wide TrackingAllocator.
class CpuDeviceMeter final : public DeviceMeter {
 public:
  CpuDeviceMeter() : alloc_(TrackingAllocator::cpu()) {}
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  int64_t allocated_bytes() const override { return alloc_.allocated_bytes(); }
  int64_t reserved_bytes() const override { return alloc_.allocated_bytes(); }
  int64_t peak_allocated_bytes() const override { return alloc_.peak_allocated_bytes(); }
  int64_t peak_reserved_bytes() const override { return alloc_.peak_allocated_bytes(); }
  int64_t num_alloc_retries() const override { return 0; }
  int64_t limit_device_bytes(int64_t device_bytes) override {
    if (device_bytes < 0) throw std::invalid_argument("--gpu-mem " + std::to_string(device_bytes) + ": negative");
    const int64_t budget = device_bytes > 0 ? alloc_.allocated_bytes() + device_bytes : 0;
    alloc_.set_budget_bytes(budget);
    return budget;
  }
  void reset_peak() override { alloc_.reset_peak(); }
  void mark(const std::string& phase) override { alloc_.mark(phase); }
  std::vector<TimelinePoint> timeline() const override {
    std::vector<TimelinePoint> points = alloc_.timeline();
    for (auto& p : points) {
      p.reserved_bytes = p.allocated_bytes;
      p.peak_reserved_bytes = p.peak_allocated_bytes;
    }
    return points;
  }

 private:
  TrackingAllocator& alloc_;
};

// The first two of --device's rules, on a device kind.
void check_device_kind(const std::string& text, bool cpu, bool cuda) {
  if (!cpu && !cuda) throw std::invalid_argument("--device " + text + ": expected cpu or cuda");
  if (cuda && !cuda_meter_built())
    throw std::invalid_argument("--device " + text + ": this build has no CUDA (LibTorch for CPU); use --device cpu");
}

}  // namespace

c10::Device parse_device(const std::string& text) {
  check_device_kind(text, text == "cpu", text == "cuda");
  return c10::Device(text);
}

void check_device(const c10::Device& device) {
  check_device_kind(device.str(), device.is_cpu(), device.is_cuda());
  if (device.is_cpu()) return;
  const int index = device.has_index() ? device.index() : 0;
  const auto visible = static_cast<int>(torch::cuda::device_count());
  if (index >= visible)
    throw std::invalid_argument("--device " + device.str() + ": " + std::to_string(visible) +
                                " CUDA device(s) visible (one GPU per rank: cuda:LOCAL_RANK)");
}

std::unique_ptr<DeviceMeter> make_device_meter(c10::Device device) {
  check_device(device);
  if (device.is_cpu()) return std::make_unique<CpuDeviceMeter>();
#ifdef SHARDFIT_CUDA_TORCH
  return std::make_unique<CudaMeter>(device.has_index() ? device.index() : 0);
#else
  throw std::logic_error("make_device_meter: check_device let a CUDA device through a CPU build");
#endif
}

bool cuda_meter_built() {
#ifdef SHARDFIT_CUDA_TORCH
  return true;
#else
  return false;
#endif
}

}  // namespace shardfit::executor
