// The nccl backend (see nccl_comm.h): rendezvous over a c10d TCPStore, one
// NCCL communicator and one CUDA stream per group, events between that
// stream and the compute stream, a watchdog that aborts on errors and
// timeouts.
//
// The store and process-identity code mirrors the gloo backend's in
// comm.cc (kept there private); the keys live under "shardfit/nccl/" so
// both backends can share a store.
#include "executor/nccl_comm.h"
#include "executor/comm_detail.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef SHARDFIT_CUDA_TORCH
#include <c10/cuda/CUDAStream.h>
#endif

#include "executor/nccl_group.h"
#include "executor/nccl_types.h"

namespace shardfit::executor {

using Clock = std::chrono::steady_clock;

namespace {

using nccl_detail::cuda_error_text;
using nccl_detail::GroupState;
using nccl_detail::nccl_error_text;
using nccl_detail::NcclWorld;
using nccl_detail::Pending;

// ---- small helpers ----------------------------------------------------------

using comm_detail::join_ints;
using comm_detail::seconds_str;

// Selects `device` for this thread while alive.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) (void)cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// Where the caller's kernels run: torch's current stream when LibTorch has
// CUDA, else the legacy default stream (what plain CUDA code uses).
cudaStream_t compute_stream(int device) {
#ifdef SHARDFIT_CUDA_TORCH
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return nullptr;
#endif
}

// ---- argument contracts (programming errors: std::logic_error) ------------

void check_dense(const char* op, const char* name, const at::Tensor& t, int device) {
  if (!t.defined()) throw std::logic_error(std::string(op) + ": " + name + " is undefined");
  if (!t.is_contiguous()) throw std::logic_error(std::string(op) + ": " + name + " must be contiguous");
  if (!t.is_cuda())
    throw std::logic_error(std::string(op) + ": the nccl backend takes CUDA tensors, " + name + " is on " +
                           t.device().str() + " (use the gloo backend for CPU tensors)");
  if (t.get_device() != device)
    throw std::logic_error(std::string(op) + ": " + name + " is on " + t.device().str() +
                           ", this communicator's device is cuda:" + std::to_string(device));
}

void check_pair(const char* op, const char* big_name, const at::Tensor& big, const char* shard_name,
                const at::Tensor& shard, int world, int device) {
  check_dense(op, big_name, big, device);
  check_dense(op, shard_name, shard, device);
  comm_detail::check_pair_shape(op, big_name, big, shard_name, shard, world);
}

using comm_detail::check_avg_dtype;

// NCCL's in-place all-gather wants the shard to be exactly this rank's slot;
// any other overlap would be overwritten while it is read.
void check_shard_placement(const char* op, const at::Tensor& out, const at::Tensor& in, int rank) {
  const auto* o = static_cast<const char*>(out.data_ptr());
  const auto* i = static_cast<const char*>(in.data_ptr());
  const int64_t in_bytes = in.numel() * in.element_size();
  const int64_t out_bytes = out.numel() * out.element_size();
  if (i == o + rank * in_bytes) return;
  if (i < o + out_bytes && o < i + in_bytes)
    throw std::logic_error(std::string(op) + ": the input shard overlaps the output but is not this rank's slot");
}

// ---- who a rank's process is (shared with comm.cc's gloo backend) ----------

using comm_detail::decode;
using comm_detail::encode;
using comm_detail::process_alive;
using comm_detail::ProcessId;
using comm_detail::this_process;

std::vector<uint8_t> bytes_of(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return {p, p + n};
}

// ---- NcclWork ---------------------------------------------------------------

}  // namespace

struct NcclWork::Impl {
  std::shared_ptr<GroupState> group;
  std::shared_ptr<Pending> pending;
  std::vector<at::Tensor> keep_alive;
  int device = 0;
  bool waited = false;
};

NcclWork::NcclWork() = default;
NcclWork::NcclWork(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclWork::NcclWork(NcclWork&&) noexcept = default;
NcclWork& NcclWork::operator=(NcclWork&& other) noexcept {
  if (this != &other) {
    if (impl_ && !impl_->waited) {
      try {
        wait();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

NcclWork::~NcclWork() {
  if (!impl_ || impl_->waited) return;
  try {
    wait();
  } catch (...) {  // a destructor must not throw; the communicator reports the failure
  }
}

bool NcclWork::completed() const {
  if (!impl_ || !impl_->pending) return true;
  return cudaEventQuery(impl_->pending->done) == cudaSuccess;
}

void NcclWork::wait() {
  if (!impl_ || impl_->waited) return;
  impl_->waited = true;
  if (impl_->pending) {
    DeviceGuard guard(impl_->device);
    cudaError_t e = cudaStreamWaitEvent(compute_stream(impl_->device), impl_->pending->done, 0);
    if (e != cudaSuccess) {
      std::lock_guard<std::mutex> lock(impl_->group->mu);
      impl_->group->fail_locked(impl_->pending->op, "cudaStreamWaitEvent: " + cuda_error_text(e), false);
      impl_->keep_alive.clear();
      throw impl_->group->error_locked(impl_->pending->op);
    }
  }
  impl_->keep_alive.clear();
}

void NcclWork::synchronize() {
  if (!impl_) return;
  if (impl_->pending) impl_->group->host_wait(*impl_->pending);
  wait();
}

namespace {

// ---- rendezvous -------------------------------------------------------------

// The group's rendezvous (comm_detail::store_rendezvous), named for messages.
std::vector<std::vector<uint8_t>> group_rendezvous(NcclWorld& w, const std::string& key, int group_rank,
                                                   const std::vector<int>& globals,
                                                   const std::vector<uint8_t>& announcement) {
  return comm_detail::store_rendezvous(*w.store,
                                       "nccl rendezvous of group {" + join_ints(globals) + "} at " + w.store_address,
                                       key, group_rank, globals, w.global_rank, w.timeout, announcement);
}

// ---- the communicator -------------------------------------------------------

// The Communicator-level handle of an issued NCCL collective: waiting is
// the compute stream's wait on it (NcclWork::wait), the host goes on.
class PendingWork final : public PendingCollective {
 public:
  explicit PendingWork(NcclWork work) : work_(std::move(work)) {}
  void wait() override { work_.wait(); }

 private:
  NcclWork work_;
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  // Joins the group `name` (unique within the world) as `rank` of `globals`.
  NcclCommunicatorImpl(std::shared_ptr<NcclWorld> world, std::string name, int rank, std::vector<int> globals)
      : world_(std::move(world)), name_(std::move(name)), rank_(rank), group_(std::make_shared<GroupState>()) {
    group_->world = world_;
    group_->global_ranks = std::move(globals);
    const int n = world_size();
    const std::string key = "group/" + name_;

    // The group's first member makes the id; it is in the store before its
    // "joined" key, so whoever saw every member join can read it.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank_ == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw CommError("nccl rendezvous failed on rank " + std::to_string(world_->global_rank) +
                            ": ncclGetUniqueId: NCCL " + ncclGetErrorString(r),
                        "rendezvous", {});
      world_->store->set(key + "/unique_id", bytes_of(&id, sizeof(id)));
    }
    const std::string me = encode(this_process());
    auto announcements = group_rendezvous(*world_, key, rank_, group_->global_ranks, {me.begin(), me.end()});
    if (name_ == "world")
      for (const auto& a : announcements) world_->processes.push_back(decode(a));
    if (rank_ != 0) {
      std::vector<uint8_t> bytes = world_->store->get(key + "/unique_id");
      if (bytes.size() != sizeof(id))
        throw CommError("nccl rendezvous failed on rank " + std::to_string(world_->global_rank) +
                            ": the unique id in the store has " + std::to_string(bytes.size()) + " bytes, expected " +
                            std::to_string(sizeof(id)) + " (a different NCCL version on rank " +
                            std::to_string(group_->global_ranks[0]) + "?)",
                        "rendezvous", {});
      std::memcpy(&id, bytes.data(), sizeof(id));
    }

    DeviceGuard guard(world_->device);
    try {
      int least = 0, greatest = 0;
      check_cuda("rendezvous", cudaDeviceGetStreamPriorityRange(&least, &greatest),
                 "cudaDeviceGetStreamPriorityRange");
      // High priority, as FSDP2's all-gather streams: the compute stream
      // waits on these collectives, so they should not queue behind it.
      check_cuda("rendezvous", cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
                 "cudaStreamCreateWithPriority");
      check_cuda("rendezvous", cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming),
                 "cudaEventCreate");
      group_->comm = init_comm(id, n);
    } catch (...) {
      if (inputs_ready_) (void)cudaEventDestroy(inputs_ready_);
      if (stream_) (void)cudaStreamDestroy(stream_);
      throw;
    }
    spdlog::debug("nccl: rank {} of group {{{}}} on cuda:{} ({})", rank_, join_ints(group_->global_ranks),
                  world_->device, nccl_version_string());
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicatorImpl() override {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    DeviceGuard guard(world_->device);
    bool healthy = false;
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      healthy = group_->failure.empty() && group_->comm;
    }
    if (healthy) {
      try {
        synchronize();
      } catch (const std::exception&) {  // synchronize aborted the communicator
      }
    }
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (group_->comm) {
        // Finalize flushes (nonblocking: polled, bounded), destroy frees;
        // abort when finalizing fails or hangs.
        ncclResult_t r = ncclCommFinalize(group_->comm);
        const auto started = Clock::now();
        while (r == ncclSuccess || r == ncclInProgress) {
          r = poll_async(group_->comm);
          if (r != ncclInProgress || Clock::now() - started > world_->timeout) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (r == ncclSuccess)
          (void)ncclCommDestroy(group_->comm);
        else
          (void)ncclCommAbort(group_->comm);
        group_->comm = nullptr;
      }
      group_->in_flight.clear();
    }
    if (barrier_scalar_) (void)cudaFree(barrier_scalar_);
    if (inputs_ready_) (void)cudaEventDestroy(inputs_ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  Backend backend() const override { return Backend::kNccl; }
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(group_->global_ranks.size()); }
  const std::vector<int>& global_ranks() const override { return group_->global_ranks; }
  int device() const override { return world_->device; }
  CUstream_st* stream() const override { return stream_; }

  // ---- asynchronous collectives ----

  NcclWork all_gather_into_work(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    const char* op = "all_gather_into";
    check_pair(op, "out_flat", out_flat, "in_shard", in_shard, world_size(), device());
    check_shard_placement(op, out_flat, in_shard, rank_);
    const ncclDataType_t type = nccl_data_type(in_shard.scalar_type());
    void* out = out_flat.data_ptr();
    const void* in = in_shard.data_ptr();
    const size_t count = static_cast<size_t>(in_shard.numel());
    return issue(op, true, {out_flat, in_shard}, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(in, out, count, type, comm, s);
    });
  }

  NcclWork reduce_scatter_work(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp reduce) override {
    const char* op = "reduce_scatter";
    check_pair(op, "in_flat", in_flat, "out_shard", out_shard, world_size(), device());
    check_avg_dtype(op, out_shard, reduce);
    const ncclDataType_t type = nccl_reduction_type(out_shard.scalar_type());
    const ncclRedOp_t red = nccl_reduce_op(reduce);
    void* out = out_shard.data_ptr();
    const void* in = in_flat.data_ptr();
    const size_t count = static_cast<size_t>(out_shard.numel());
    return issue(op, false, {out_shard, in_flat}, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(in, out, count, type, red, comm, s);
    });
  }

  NcclWork all_reduce_work(const at::Tensor& t, ReduceOp reduce) override {
    const char* op = "all_reduce";
    check_dense(op, "t", t, device());
    check_avg_dtype(op, t, reduce);
    const ncclDataType_t type = nccl_reduction_type(t.scalar_type());
    const ncclRedOp_t red = nccl_reduce_op(reduce);
    void* p = t.data_ptr();
    const size_t count = static_cast<size_t>(t.numel());
    return issue(op, false, {t}, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(p, p, count, type, red, comm, s);
    });
  }

  NcclWork broadcast_async(const at::Tensor& t, int root) override {
    const char* op = "broadcast";
    check_dense(op, "t", t, device());
    if (root < 0 || root >= world_size())
      throw std::logic_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                             std::to_string(world_size()));
    const ncclDataType_t type = nccl_data_type(t.scalar_type());
    void* p = t.data_ptr();
    const size_t count = static_cast<size_t>(t.numel());
    return issue(op, false, {t}, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(p, p, count, type, root, comm, s);
    });
  }

  // ---- the Communicator interface: asynchronous, then the compute stream waits

  void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    all_gather_into_work(out_flat, in_shard).wait();
  }
  void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp reduce) override {
    reduce_scatter_work(out_shard, in_flat, reduce).wait();
  }
  void all_reduce(const at::Tensor& t, ReduceOp reduce) override { all_reduce_work(t, reduce).wait(); }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& out_shard, const at::Tensor& in_flat,
                                                          ReduceOp reduce) override {
    return std::make_unique<PendingWork>(reduce_scatter_work(out_shard, in_flat, reduce));
  }
  std::unique_ptr<PendingCollective> all_reduce_async(const at::Tensor& t, ReduceOp reduce) override {
    return std::make_unique<PendingWork>(all_reduce_work(t, reduce));
  }
  std::unique_ptr<PendingCollective> all_gather_into_async(const at::Tensor& out_flat,
                                                           const at::Tensor& in_shard) override {
    return std::make_unique<PendingWork>(all_gather_into_work(out_flat, in_shard));
  }
  void broadcast(const at::Tensor& t, int root) override { broadcast_async(t, root).wait(); }

  // A one-float all-reduce that the host waits for. The operand's value is
  // never read: sums of garbage are fine.
  void barrier() override {
    const char* op = "barrier";
    if (!barrier_scalar_) {
      DeviceGuard guard(device());
      check_cuda(op, cudaMalloc(&barrier_scalar_, kNcclBarrierScalarBytes), "cudaMalloc");
    }
    void* p = barrier_scalar_;
    NcclWork w = issue(op, false, {}, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm, s);
    });
    w.synchronize();
  }

  void synchronize() override {
    std::shared_ptr<Pending> newest;
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (!group_->failure.empty()) throw group_->error_locked("synchronize");
      if (!group_->in_flight.empty()) newest = group_->in_flight.back();
    }
    if (newest) group_->host_wait(*newest);
  }

  int in_flight_all_gathers() override {
    std::lock_guard<std::mutex> lock(group_->mu);
    group_->retire_locked();
    return count_all_gathers_locked();
  }

  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    std::set<int> seen;
    for (int r : ranks) {
      if (r < 0 || r >= world_size())
        throw std::invalid_argument("new_group: rank " + std::to_string(r) + " is outside the group of " +
                                    std::to_string(world_size()));
      if (!seen.insert(r).second)
        throw std::invalid_argument("new_group: rank " + std::to_string(r) + " is listed twice");
    }
    if (!seen.count(rank_))
      throw std::invalid_argument("new_group: only members create a group; rank " + std::to_string(rank_) +
                                  " is not in {" + join_ints(ranks) + "}");
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (!group_->failure.empty()) throw group_->error_locked("new_group");
    }
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(group_->global_ranks[r]);
    const std::string members = join_ints(globals, ",");
    const std::string name = name_ + "/" + members + "#" + std::to_string(groups_created_[members]++);
    const int my_index = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
    return std::make_unique<NcclCommunicatorImpl>(world_, name, my_index, std::move(globals));
  }

 private:
  // Nonblocking initialisation, polled: a peer that never connects is a
  // timeout with a message, not a hang.
  ncclComm_t init_comm(const ncclUniqueId& id, int n) {
    const std::string what = "nccl initialisation of group {" + join_ints(group_->global_ranks) +
                             "} failed on rank " + std::to_string(world_->global_rank) + ": ";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank_, &config);
    const auto started = Clock::now();
    while (comm && (r == ncclSuccess || r == ncclInProgress)) {
      r = poll_async(comm);
      if (r != ncclInProgress) break;
      if (Clock::now() - started > world_->timeout) {
        (void)ncclCommAbort(comm);
        throw CommError(what + "did not complete within " + seconds_str(world_->timeout), "rendezvous", {});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (r != ncclSuccess || !comm) {
      std::string detail = nccl_error_text(r == ncclSuccess ? ncclInternalError : r, comm);
      if (comm) (void)ncclCommAbort(comm);
      throw CommError(what + detail, "rendezvous", {});
    }
    return comm;
  }

  static ncclResult_t poll_async(ncclComm_t comm) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    return r != ncclSuccess ? r : state;
  }

  void check_cuda(const char* op, cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    throw CommError(std::string(op) + " failed on rank " + std::to_string(world_->global_rank) + ": " + call +
                        ": CUDA " + cuda_error_text(e),
                    op, {});
  }

  int count_all_gathers_locked() const {
    int n = 0;
    for (const auto& p : group_->in_flight) n += p->all_gather ? 1 : 0;
    return n;
  }

  // FSDP's limit_all_gathers: block the host until fewer than the limit are
  // in flight, waiting on the oldest all-gather each time.
  void wait_for_all_gather_slot() {
    const int limit = world_->options.max_in_flight_all_gathers;
    if (limit <= 0) return;
    for (;;) {
      std::shared_ptr<Pending> oldest;
      {
        std::lock_guard<std::mutex> lock(group_->mu);
        group_->retire_locked();
        if (!group_->failure.empty()) throw group_->error_locked("all_gather_into");
        if (count_all_gathers_locked() < limit) return;
        for (const auto& p : group_->in_flight)
          if (p->all_gather) {
            oldest = p;
            break;
          }
      }
      group_->host_wait(*oldest);
    }
  }

  // Enqueues `call` on this communicator's stream after the compute stream's
  // work so far, records its done event, and returns the work.
  template <typename Call>
  NcclWork issue(const char* op, bool all_gather, std::vector<at::Tensor> keep, Call&& call) {
    if (all_gather) wait_for_all_gather_slot();
    DeviceGuard guard(device());
    auto pending = std::make_shared<Pending>();
    pending->op = op;
    pending->all_gather = all_gather;
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      group_->check_health_locked();
      if (!group_->failure.empty()) throw group_->error_locked(op);
      auto fail = [&](const std::string& detail) -> CommError {
        group_->fail_locked(op, detail, false);
        return group_->error_locked(op);
      };
      cudaError_t e = cudaEventRecord(inputs_ready_, compute_stream(device()));
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, inputs_ready_, 0);
      if (e != cudaSuccess) throw fail("ordering after the compute stream: CUDA " + cuda_error_text(e));
      e = cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming);
      if (e != cudaSuccess) throw fail("cudaEventCreate: CUDA " + cuda_error_text(e));
      pending->issued = Clock::now();
      ncclResult_t r = call(group_->comm, stream_);
      // Nonblocking communicator: the enqueue itself may still be in progress.
      while (r == ncclInProgress) {
        if (Clock::now() - pending->issued > world_->timeout)
          throw fail("enqueueing did not complete within " + seconds_str(world_->timeout));
        std::this_thread::yield();
        r = poll_async(group_->comm);
      }
      if (r != ncclSuccess)
        throw fail(nccl_error_text(r, group_->comm));
      e = cudaEventRecord(pending->done, stream_);
      if (e != cudaSuccess) throw fail("cudaEventRecord: CUDA " + cuda_error_text(e));
      group_->in_flight.push_back(pending);
    }
    auto impl = std::make_unique<NcclWork::Impl>();
    impl->group = group_;
    impl->pending = std::move(pending);
    impl->keep_alive = std::move(keep);
    impl->device = device();
    return NcclWork(std::move(impl));
  }

  // The watchdog: finds errors and timeouts while the host is elsewhere.
  void watch() {
    DeviceGuard guard(world_->device);
    std::unique_lock<std::mutex> stop_lock(stop_mu_);
    while (!stop_cv_.wait_for(stop_lock, world_->options.watchdog_period, [this] { return stop_; })) {
      std::string failure;
      Clock::time_point failed_at;
      bool reported = false;
      {
        std::lock_guard<std::mutex> lock(group_->mu);
        group_->check_health_locked();
        failure = group_->failure;
        failed_at = group_->failure_at;
        reported = group_->failure_reported;
      }
      if (failure.empty() || reported || !world_->options.exit_process_on_failure) continue;
      if (Clock::now() - failed_at < world_->options.exit_grace) continue;
      // Nobody on the host side noticed within the grace period: it is
      // blocked elsewhere (a synchronize on the compute stream). End the
      // process as a failed environment (SPEC exit code 3).
      std::fprintf(stderr, "shardfit: %s (the nccl watchdog ends this rank)\n", failure.c_str());
      std::fflush(stderr);
      _exit(3);
    }
  }

  std::shared_ptr<NcclWorld> world_;
  std::string name_;
  int rank_;
  std::shared_ptr<GroupState> group_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
  void* barrier_scalar_ = nullptr;
  std::map<std::string, int> groups_created_;
  std::thread watchdog_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

int choose_device(int rank, int requested, int visible) {
  int device = requested;
  if (device < 0) {
    const char* local = std::getenv("LOCAL_RANK");
    device = (local && *local) ? std::atoi(local) : rank;
    device = visible > 0 ? device % visible : device;
  }
  if (device >= visible)
    throw std::invalid_argument("--backend nccl: cuda:" + std::to_string(device) + " is not visible (" +
                                std::to_string(visible) + " CUDA device(s); check CUDA_VISIBLE_DEVICES)");
  return device;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cuda_error_text(e);
    (void)cudaGetLastError();  // not sticky: clear it
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found 0 devices";
  return n;
}

std::string nccl_version_string() {
  int v = 0;
  std::string loaded = "?";
  if (ncclGetVersion(&v) == ncclSuccess) {
    // NCCL >= 2.9 codes versions as major*10000 + minor*100 + patch.
    loaded = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  return "NCCL " + loaded + " (headers " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
         std::to_string(NCCL_PATCH) + ")";
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const CommOptions& o, const NcclOptions& nccl) {
  comm_detail::check_comm_options(o, /*store=*/true);
  std::string why;
  const int visible = cuda_device_count(&why);
  if (visible == 0)
    throw std::invalid_argument("--backend nccl: no CUDA device is visible (" + why +
                                "); use --backend gloo on CPU, or loopback");

  comm_detail::ignore_sigpipe();
  auto world = std::make_shared<NcclWorld>();
  world->timeout = o.timeout;
  world->global_rank = o.rank;
  world->options = nccl;
  world->device = choose_device(o.rank, nccl.device, visible);
  world->store_address = comm_detail::store_address(o);
  world->store = comm_detail::connect_store(o, "shardfit/nccl");

  std::vector<int> globals(static_cast<size_t>(o.world_size));
  for (int r = 0; r < o.world_size; ++r) globals[r] = r;
  return std::make_unique<NcclCommunicatorImpl>(world, "world", o.rank, std::move(globals));
}

}  // namespace shardfit::executor
