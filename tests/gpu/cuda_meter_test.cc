// The CUDA meter against the caching allocator it reads. Built only with a
// CUDA LibTorch; every test skips with the reason when no device is visible.
// Sizes are multiples of 2 MiB so the allocator's rounding (512 B, and 2 MiB
// segments for the large pool) adds nothing: the byte counts are exact.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "executor/cuda_meter.h"

namespace shardfit::executor {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

#define SKIP_WITHOUT_DEVICE()                                                              \
  do {                                                                                     \
    if (!torch::cuda::is_available())                                                      \
      GTEST_SKIP() << "no CUDA device: torch::cuda::is_available() is false (LibTorch " \
                   << TORCH_VERSION << " has CUDA, this machine has no visible GPU)";      \
  } while (0)

at::Tensor mib_on_gpu(int64_t mib) {
  return at::empty({mib * kMiB}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
}

// Each test starts from a clean allocator and leaves no cap behind.
class CudaMeterTest : public testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    meter_ = std::make_unique<CudaMeter>(0);
    meter_->release_cached();
    meter_->reset_peak();
    base_ = meter_->allocated_bytes();
  }
  void TearDown() override {
    if (meter_) {
      meter_->set_budget_bytes(0);
      meter_->release_cached();
    }
  }
  std::unique_ptr<CudaMeter> meter_;
  int64_t base_ = 0;
};

TEST_F(CudaMeterTest, AllocatedAndReservedFollowATensor) {
  {
    at::Tensor t = mib_on_gpu(64);
    EXPECT_EQ(meter_->allocated_bytes() - base_, 64 * kMiB);
    EXPECT_GE(meter_->reserved_bytes(), meter_->allocated_bytes());
    meter_->mark("with");
  }
  meter_->mark("without");
  auto tl = meter_->timeline();
  ASSERT_EQ(tl.size(), 2u);
  EXPECT_EQ(tl[0].label, "with");
  EXPECT_EQ(tl[0].allocated_bytes - base_, 64 * kMiB);
  EXPECT_EQ(tl[0].peak_allocated_bytes - base_, 64 * kMiB);
  EXPECT_EQ(tl[1].allocated_bytes, base_);
  // The block went back to the cache, not to the driver.
  EXPECT_EQ(tl[1].reserved_bytes, tl[0].reserved_bytes);
  // Each point's peak covers the time since the previous point.
  EXPECT_EQ(tl[1].peak_allocated_bytes - base_, 64 * kMiB);
  EXPECT_GE(meter_->num_allocs(), 1);
}

TEST_F(CudaMeterTest, ThePeakSurvivesMarks) {
  { at::Tensor a = mib_on_gpu(32); }
  meter_->mark("a");
  { at::Tensor b = mib_on_gpu(8); }
  meter_->mark("b");
  EXPECT_EQ(meter_->peak_allocated_bytes() - base_, 32 * kMiB);
  auto tl = meter_->timeline();
  ASSERT_EQ(tl.size(), 2u);
  EXPECT_EQ(tl[1].peak_allocated_bytes - base_, 8 * kMiB);
  meter_->reset_peak();
  EXPECT_EQ(meter_->peak_allocated_bytes(), meter_->allocated_bytes());
  EXPECT_TRUE(meter_->timeline().empty());
}

TEST_F(CudaMeterTest, PastTheBudgetAnAllocationIsAReportedOom) {
  const int64_t budget = meter_->reserved_bytes() + 256 * kMiB;
  meter_->set_budget_bytes(budget);
  EXPECT_EQ(meter_->budget_bytes(), budget);
  auto oom = meter_->run_catching_oom([] { at::Tensor big = mib_on_gpu(512); });
  ASSERT_TRUE(oom.has_value()) << "512 MiB fit under a 256 MiB budget";
  EXPECT_NE(oom->message.find("out of memory"), std::string::npos) << oom->message;
  EXPECT_EQ(oom->budget_bytes, budget);
  EXPECT_GE(meter_->num_ooms(), 1);
  EXPECT_EQ(meter_->timeline().back().label, "oom");
  // The process goes on: what fits still fits.
  auto ok = meter_->run_catching_oom([] { at::Tensor small = mib_on_gpu(128); });
  EXPECT_FALSE(ok.has_value());
  EXPECT_LE(meter_->peak_reserved_bytes(), budget);
}

TEST_F(CudaMeterTest, ACardOfNBytesLeavesTheAllocatorNMinusWhatIsOutsideIt) {
  const int64_t card = 24 * 1024 * kMiB;
  const int64_t outside = meter_->outside_allocator_bytes();
  EXPECT_GT(outside, 0) << "a CUDA context holds device memory";
  const int64_t budget = meter_->set_device_memory_bytes(card);
  // outside_allocator_bytes is read again inside: allow a little drift.
  EXPECT_NEAR(static_cast<double>(budget), static_cast<double>(card - outside), 64.0 * kMiB);
  EXPECT_EQ(meter_->budget_bytes(), budget);
  RecordProperty("outside_allocator_bytes", std::to_string(outside));
}

TEST_F(CudaMeterTest, ABudgetPastTheCardIsRefused) {
  EXPECT_THROW(meter_->set_budget_bytes(meter_->device_total_bytes() + 1), std::invalid_argument);
  EXPECT_THROW(meter_->set_budget_bytes(-1), std::invalid_argument);
  EXPECT_THROW(meter_->set_device_memory_bytes(1 * kMiB), std::invalid_argument);
}

TEST_F(CudaMeterTest, OtherErrorsPropagate) {
  EXPECT_THROW(meter_->run_catching_oom([] { throw std::runtime_error("not an OOM"); }), std::runtime_error);
}

TEST_F(CudaMeterTest, TheAllocatorHistoryHoldsEveryAllocAndFreeWithItsPhase) {
  at::Tensor held = mib_on_gpu(4);  // live when the recording begins: in its start state
  meter_->record_allocator_history();
  {
    at::Tensor t = mib_on_gpu(64);
    meter_->mark("with");
  }
  meter_->mark("without");
  const std::string path = testing::TempDir() + "cuda_meter_history.json";
  meter_->write_allocator_history(path);
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  std::remove(path.c_str());
  EXPECT_EQ(j.at("schema"), "shardfit.allocator-history/1");
  bool held_at_start = false;
  for (const auto& s : j.at("start_segments")) {
    for (const auto& b : s.at("blocks")) held_at_start = held_at_start || (b.at("allocated") && b.at("size") == 4 * kMiB);
  }
  EXPECT_TRUE(held_at_start) << j.at("start_segments").dump();
  // The 64 MiB block: allocated before the "with" mark, freed after it.
  std::string alloc_after = "?", free_after = "?";
  for (const auto& e : j.at("events")) {
    if (e.at("size") != 64 * kMiB) continue;
    if (e.at("action") == "alloc") alloc_after = e.at("after");
    if (e.at("action") == "free_completed") free_after = e.at("after");
  }
  EXPECT_EQ(alloc_after, "");
  EXPECT_EQ(free_after, "with");
}

}  // namespace
}  // namespace shardfit::executor
