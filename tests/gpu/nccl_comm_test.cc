// The nccl backend. Everywhere NCCL is found (CI, no GPU): the dtype and
// reduction mapping, the documented memory costs, argument checks, the
// error without a device. With a CUDA LibTorch and a visible device: the
// collectives on a world of one rank (NCCL refuses two ranks on one GPU),
// the stream/event contract, the all-gather rate limit, the timeout and
// watchdog, the rendezvous naming a missing rank, and NCCL's own memory
// outside the caching allocator (measured and printed, not asserted: it
// depends on NCCL's version and the topology).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#ifdef SHARDFIT_CUDA_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "executor/comm.h"
#include "executor/launcher.h"
#include "executor/nccl_comm.h"
#include "executor/nccl_types.h"

namespace shardfit::executor {
namespace {

using std::chrono::milliseconds;

// ---- the mapping (no device) -------------------------------------------------

TEST(NcclTypes, EveryDtypeNcclCanCarryMapsToTheTypeOfTheSameWidth) {
  const std::vector<std::pair<c10::ScalarType, ncclDataType_t>> expected = {
      {c10::ScalarType::Byte, ncclUint8},     {c10::ScalarType::Char, ncclInt8},
      {c10::ScalarType::Int, ncclInt32},      {c10::ScalarType::Long, ncclInt64},
      {c10::ScalarType::Half, ncclFloat16},   {c10::ScalarType::Float, ncclFloat32},
      {c10::ScalarType::Double, ncclFloat64}, {c10::ScalarType::BFloat16, ncclBfloat16},
      {c10::ScalarType::Bool, ncclUint8},
  };
  for (const auto& [dtype, nccl] : expected) {
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_EQ(nccl_data_type(dtype), nccl);
    // NCCL counts elements: the widths must agree or a count moves the
    // wrong number of bytes.
    EXPECT_EQ(nccl_element_bytes(nccl_data_type(dtype)), c10::elementSize(dtype));
  }
}

TEST(NcclTypes, DtypesWithoutAnNcclTypeAreRefusedByName) {
  for (auto dtype : {c10::ScalarType::Short, c10::ScalarType::ComplexFloat, c10::ScalarType::ComplexDouble}) {
    try {
      nccl_data_type(dtype);
      ADD_FAILURE() << c10::toString(dtype) << " mapped to an NCCL type";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(c10::toString(dtype)), std::string::npos) << e.what();
    }
  }
}

TEST(NcclTypes, BoolMovesAsBytesButIsNotReduced) {
  EXPECT_EQ(nccl_data_type(c10::ScalarType::Bool), ncclUint8);
  EXPECT_THROW(nccl_reduction_type(c10::ScalarType::Bool), std::invalid_argument);
  EXPECT_EQ(nccl_reduction_type(c10::ScalarType::Float), ncclFloat32);
}

TEST(NcclTypes, AvgIsNcclsOwnAverage) {
  EXPECT_EQ(nccl_reduce_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl_reduce_op(ReduceOp::kAvg), ncclAvg);
}

TEST(NcclVersion, LoadedLibraryIsAtLeastTheHeaders) {
  int loaded = 0;
  ASSERT_EQ(ncclGetVersion(&loaded), ncclSuccess);
  // Calls compiled against newer headers than the library may not exist.
  EXPECT_GE(loaded, NCCL_VERSION_CODE) << nccl_version_string();
  EXPECT_NE(nccl_version_string().find("NCCL"), std::string::npos);
}

// ---- the documented memory costs (no device) ---------------------------------

TEST(NcclMemory, NoCollectiveAllocatesThroughTheCachingAllocator) {
  for (auto op : {Collective::kAllGatherInto, Collective::kReduceScatter, Collective::kAllReduce,
                  Collective::kBroadcast, Collective::kBarrier})
    for (int world : {1, 2, 8})
      for (int64_t bytes : {int64_t{4}, int64_t{1} << 20, int64_t{3} << 30}) {
        SCOPED_TRACE(std::string(collective_name(op)) + " world " + std::to_string(world));
        CollectiveMemory m = collective_extra_memory(Backend::kNccl, op, bytes, world);
        EXPECT_EQ(m.allocator_bytes, kNcclCachingAllocatorBytesPerCollective);
        EXPECT_EQ(m.library_host_bytes_max, 0);
      }
  EXPECT_EQ(kNcclCachingAllocatorBytesPerCollective, 0);
}

TEST(NcclMemory, FixedCostsAreTheDocumentedOnes) {
  EXPECT_EQ(kNcclBarrierScalarBytes, static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(kNcclDefaultBuffSizeBytes, 4 * 1024 * 1024);  // NCCL_BUFFSIZE's documented default
  EXPECT_EQ(kNcclDefaultMaxInFlightAllGathers, 2);        // FSDP's limit_all_gathers
  EXPECT_EQ(NcclOptions{}.max_in_flight_all_gathers, kNcclDefaultMaxInFlightAllGathers);
}

std::filesystem::path source_dir() {
  if (const char* d = std::getenv("SHARDFIT_SOURCE_DIR"); d && *d) return d;
  // Run by hand from build-*/tests/gpu/: the checkout is three levels up.
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : exe.parent_path().parent_path().parent_path().parent_path();
}

// NCCL's own buffers are outside the caching allocator, so the planner takes
// them from the profile: every CUDA profile must say how much and why.
TEST(NcclMemory, EveryCudaProfileChargesNcclBuffersWithASource) {
  const auto dir = source_dir() / "profiles";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "profiles not found at " << dir << " (set SHARDFIT_SOURCE_DIR)";
  int cuda_profiles = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().filename().string());
    nlohmann::json p = nlohmann::json::parse(std::ifstream(entry.path()));
    if (p.value("kind", "") != "cuda") continue;
    ++cuda_profiles;
    ASSERT_TRUE(p.contains("overheads_bytes") && p["overheads_bytes"].contains("nccl_buffers"));
    EXPECT_GE(p["overheads_bytes"]["nccl_buffers"].get<int64_t>(), kNcclDefaultBuffSizeBytes);
    ASSERT_TRUE(p.contains("sources") && p["sources"].contains("overheads_bytes.nccl_buffers"));
    EXPECT_FALSE(p["sources"]["overheads_bytes.nccl_buffers"].get<std::string>().empty());
  }
  EXPECT_GT(cuda_profiles, 0);
}

// ---- construction without a device ------------------------------------------

CommOptions nccl_options(int rank, int world, int port, milliseconds timeout = milliseconds(20000)) {
  CommOptions o;
  o.backend = Backend::kNccl;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout = timeout;
  return o;
}

TEST(NcclComm, ImpossibleOptionsAreRefusedBeforeLookingForADevice) {
  EXPECT_THROW(make_nccl_communicator(nccl_options(2, 2, 29500)), std::invalid_argument);
  EXPECT_THROW(make_nccl_communicator(nccl_options(0, 0, 29500)), std::invalid_argument);
  EXPECT_THROW(make_nccl_communicator(nccl_options(0, 1, 70000)), std::invalid_argument);
}

TEST(NcclComm, WithoutADeviceTheBackendSaysSoAndSuggestsGloo) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is visible: this test is for machines without one";
  try {
    make_communicator(nccl_options(0, 1, pick_free_port()));
    FAIL() << "made an nccl communicator without a device";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no CUDA device is visible"), std::string::npos) << what;
    EXPECT_NE(what.find("gloo"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

// ---- with a device ----------------------------------------------------------

// Why a GPU test cannot run here, or empty when it can.
std::string why_no_gpu() {
#ifndef SHARDFIT_CUDA_TORCH
  return "collectives need CUDA tensors and this LibTorch " TORCH_VERSION " is CPU-only";
#else
  std::string why;
  if (cuda_device_count(&why) == 0) return "no CUDA device: " + why;
  if (!torch::cuda::is_available()) return "no CUDA device: torch::cuda::is_available() is false";
  return "";
#endif
}

#define SKIP_WITHOUT_GPU()                             \
  do {                                                 \
    const std::string why = why_no_gpu();              \
    if (!why.empty()) GTEST_SKIP() << why;             \
  } while (0)

#ifdef SHARDFIT_CUDA_TORCH

NcclOptions test_options() {
  NcclOptions n;
  n.device = 0;
  n.exit_process_on_failure = false;
  return n;
}

at::TensorOptions on_gpu(at::ScalarType t = at::kFloat) { return at::TensorOptions().dtype(t).device(at::kCUDA, 0); }

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(0).stream(); }

// Holds the compute stream for `ms` (a host callback in its queue), so
// whatever the communicator orders after it stays in flight.
void CUDART_CB sleep_callback(void* ms) {
  std::this_thread::sleep_for(milliseconds(*static_cast<int*>(ms)));
}
void block_compute_stream(int* ms) { ASSERT_EQ(cudaLaunchHostFunc(current_stream(), sleep_callback, ms), cudaSuccess); }

TEST(NcclGpu, EveryCollectiveOnAWorldOfOne) {
  SKIP_WITHOUT_GPU();
  auto c = make_nccl_communicator(nccl_options(0, 1, pick_free_port()), test_options());
  EXPECT_EQ(c->backend(), Backend::kNccl);
  EXPECT_EQ(c->world_size(), 1);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor shard = torch::arange(1000, on_gpu(dtype));
    at::Tensor out = torch::full({1000}, -1, on_gpu(dtype));
    c->all_gather_into(out, shard);
    EXPECT_TRUE(torch::equal(out.cpu(), shard.cpu()));
    at::Tensor rs = torch::zeros({1000}, on_gpu(dtype));
    c->reduce_scatter(rs, shard, ReduceOp::kSum);
    EXPECT_TRUE(torch::equal(rs.cpu(), shard.cpu()));
    c->reduce_scatter(rs, shard, ReduceOp::kAvg);
    EXPECT_TRUE(torch::equal(rs.cpu(), shard.cpu()));
    at::Tensor t = shard.clone();
    c->all_reduce(t, ReduceOp::kSum);
    EXPECT_TRUE(torch::equal(t.cpu(), shard.cpu()));
    c->broadcast(t, 0);
    EXPECT_TRUE(torch::equal(t.cpu(), shard.cpu()));
  }
  // In place: the shard is its own slot of the flat buffer.
  at::Tensor flat = torch::arange(64, on_gpu());
  c->all_gather_into(flat, flat.narrow(0, 0, 64));
  EXPECT_TRUE(torch::equal(flat.cpu(), torch::arange(64, torch::kFloat)));
  c->barrier();
  c->synchronize();
  EXPECT_EQ(c->in_flight_all_gathers(), 0);
  auto sub = c->new_group({0});
  at::Tensor s = torch::ones({8}, on_gpu());
  sub->all_reduce(s, ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(s.cpu(), torch::ones({8})));
}

TEST(NcclGpu, ArgumentsAreCheckedOneLineEach) {
  SKIP_WITHOUT_GPU();
  auto c = make_nccl_communicator(nccl_options(0, 1, pick_free_port()), test_options());
  at::Tensor cpu = torch::zeros({8});
  EXPECT_THROW(c->all_reduce(cpu, ReduceOp::kSum), std::logic_error);
  at::Tensor ints = torch::zeros({8}, on_gpu(at::kInt));
  EXPECT_THROW(c->all_reduce(ints, ReduceOp::kAvg), std::logic_error);
  at::Tensor flags = torch::zeros({8}, on_gpu(at::kBool));
  EXPECT_THROW(c->all_reduce(flags, ReduceOp::kSum), std::invalid_argument);
  at::Tensor out = torch::zeros({10}, on_gpu());
  EXPECT_THROW(c->all_gather_into(out, torch::zeros({3}, on_gpu())), std::logic_error);
  EXPECT_THROW(c->broadcast(out, 1), std::logic_error);
}

TEST(NcclGpu, AsyncWorkOverlapsAndTheComputeStreamWaitsForIt) {
  SKIP_WITHOUT_GPU();
  auto c = make_nccl_communicator(nccl_options(0, 1, pick_free_port()), test_options());
  static int hold_ms = 300;
  at::Tensor in = torch::arange(1 << 20, on_gpu());
  at::Tensor out = torch::zeros({1 << 20}, on_gpu());
  block_compute_stream(&hold_ms);
  NcclWork w = c->all_gather_into_work(out, in);
  // Issued after the compute stream's queue: not finished while it sleeps.
  EXPECT_FALSE(w.completed());
  w.wait();  // the compute stream waits; the host does not
  EXPECT_TRUE(torch::equal(out.cpu(), in.cpu()));  // .cpu() runs on the compute stream
  EXPECT_TRUE(w.completed());
}

TEST(NcclGpu, AtMostTwoAllGathersInFlight) {
  SKIP_WITHOUT_GPU();
  auto c = make_nccl_communicator(nccl_options(0, 1, pick_free_port()), test_options());
  static int hold_ms = 400;
  std::vector<at::Tensor> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(torch::zeros({1 << 16}, on_gpu()));
  at::Tensor in = torch::ones({1 << 16}, on_gpu());
  c->synchronize();
  block_compute_stream(&hold_ms);
  std::vector<NcclWork> works;
  works.push_back(c->all_gather_into_work(outs[0], in));
  works.push_back(c->all_gather_into_work(outs[1], in));
  EXPECT_EQ(c->in_flight_all_gathers(), 2);
  const auto t0 = std::chrono::steady_clock::now();
  works.push_back(c->all_gather_into_work(outs[2], in));  // blocks until the first finishes
  const auto blocked = std::chrono::steady_clock::now() - t0;
  EXPECT_LE(c->in_flight_all_gathers(), 2);
  // The first could not finish before the compute stream's 400 ms hold:
  // 300 ms leaves room for the time the first two issues took.
  EXPECT_GE(blocked, milliseconds(300));
  for (auto& w : works) w.synchronize();
  EXPECT_EQ(c->in_flight_all_gathers(), 0);
}

TEST(NcclGpu, CollectivesAllocateNothingThroughTheCachingAllocator) {
  SKIP_WITHOUT_GPU();
  const auto stats = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0); };
  // Allocate on the device before the first getDeviceStats(0): LibTorch 2.x
  // throws there ("Invalid device argument 0: did you call init?") until the
  // caching allocator has set the device up, which the first CUDA allocation
  // does, and this test may run alone (--gtest_filter) with nothing before
  // it on the device. CudaMeter does the same (executor/cuda_meter.cc). The
  // tensor stays alive, so its segment is in both reserved figures.
  const at::Tensor first_allocation = torch::zeros({1}, on_gpu());
  size_t free0 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  const int64_t reserved0 = stats().reserved_bytes[0].current;
  auto c = make_nccl_communicator(nccl_options(0, 1, pick_free_port()), test_options());
  const int64_t n = 16 << 20;  // 64 MiB of floats
  at::Tensor flat = torch::ones({n}, on_gpu());
  at::Tensor shard = torch::ones({n}, on_gpu());
  c->synchronize();
  const int64_t allocated = stats().allocated_bytes[0].current;
  c->all_gather_into(flat, shard);
  c->reduce_scatter(shard, flat, ReduceOp::kSum);
  c->all_reduce(flat, ReduceOp::kAvg);
  c->broadcast(flat, 0);
  c->barrier();
  c->synchronize();
  EXPECT_EQ(stats().allocated_bytes[0].current, allocated) << "a collective left an allocation behind";
  size_t free1 = 0;
  cudaMemGetInfo(&free1, &total);
  const int64_t reserved1 = stats().reserved_bytes[0].current;
  // What the card lost beyond the caching allocator's growth: NCCL's
  // buffers for this (one-rank) communicator, the stream, the barrier scalar.
  const int64_t outside = (static_cast<int64_t>(free0) - static_cast<int64_t>(free1)) - (reserved1 - reserved0);
  RecordProperty("nccl_outside_allocator_bytes_world1", std::to_string(outside));
  std::printf("[nccl] %s: device memory outside the caching allocator after one of each collective "
              "(world 1): %.1f MiB\n",
              nccl_version_string().c_str(), outside / 1048576.0);
}

TEST(NcclGpu, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  SKIP_WITHOUT_GPU();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_nccl_communicator(nccl_options(0, 2, pick_free_port(), milliseconds(1500)), test_options());
    FAIL() << "rendezvous of 2 succeeded with one rank";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 never arrived"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// The timeout paths run in a child process (gtest's threadsafe death tests
// re-execute the binary): an aborted communicator is not something to keep
// using in the same process as other tests.

// The host notices: synchronize() throws the CommError.
void hang_then_synchronize() {
  CommOptions o = nccl_options(0, 1, pick_free_port(), milliseconds(1000));
  auto c = make_nccl_communicator(o, test_options());
  static int hold_ms = 5000;
  at::Tensor t = torch::ones({1024}, on_gpu());
  block_compute_stream(&hold_ms);
  c->all_reduce(t, ReduceOp::kSum);
  try {
    c->synchronize();
  } catch (const CommError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    try {
      c->barrier();
    } catch (const CommError& again) {
      std::fprintf(stderr, "then: %s\n", again.what());
      std::_Exit(4);
    }
  }
  std::_Exit(0);
}

// The host is blocked in CUDA (a synchronize on the compute stream): the
// watchdog ends the process with exit code 3.
void hang_in_cuda_synchronize() {
  CommOptions o = nccl_options(0, 1, pick_free_port(), milliseconds(1000));
  NcclOptions n = test_options();
  n.exit_process_on_failure = true;
  n.exit_grace = milliseconds(300);
  auto c = make_nccl_communicator(o, n);
  static int hold_ms = 8000;
  at::Tensor t = torch::ones({1024}, on_gpu());
  block_compute_stream(&hold_ms);
  c->all_reduce(t, ReduceOp::kSum);
  cudaStreamSynchronize(current_stream());
  std::_Exit(0);
}

TEST(NcclGpuDeathTest, ACollectivePastTheTimeoutBreaksTheCommunicator) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(hang_then_synchronize(), testing::ExitedWithCode(4),
              "all_reduce failed on rank 0: .*did not complete within 1 s.*then: barrier refused on rank 0: "
              "the communicator is broken");
}

TEST(NcclGpuDeathTest, TheWatchdogEndsARankBlockedInCuda) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(hang_in_cuda_synchronize(), testing::ExitedWithCode(3),
              "all_reduce failed on rank 0: .*did not complete within 1 s.*nccl watchdog ends this rank");
}

#else  // no CUDA LibTorch: say why the GPU half does not run

TEST(NcclGpu, CollectivesOnADevice) { SKIP_WITHOUT_GPU(); }

#endif

}  // namespace
}  // namespace shardfit::executor
