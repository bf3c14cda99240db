// The nccl backend's per-group state and health (nccl_comm.cc builds the
// communicator on it): what every group of a world shares, the collectives
// in flight with their done events, and the failure bookkeeping the
// watchdog, the works and the communicator's calls go through: the first
// failure aborts the NCCL communicator, names the peers known to have
// exited, and is reported once; later calls are refused naming it.
// Internal to executor/ (no LibTorch types beyond the store).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "executor/comm.h"
#include "executor/comm_detail.h"
#include "executor/nccl_comm.h"

namespace shardfit::executor::nccl_detail {

using Clock = std::chrono::steady_clock;

std::string cuda_error_text(cudaError_t e);
// NCCL's result and, when the communicator has one, its last error message.
std::string nccl_error_text(ncclResult_t r, ncclComm_t comm);

// What every communicator of one world shares.
struct NcclWorld {
  c10::intrusive_ptr<c10d::Store> store;  // prefixed "shardfit/nccl"
  std::string store_address;
  std::chrono::milliseconds timeout{};
  int global_rank = 0;
  int device = 0;
  NcclOptions options;
  std::vector<comm_detail::ProcessId> processes;  // by global rank, from the world rendezvous
};

// ---- one group's state, shared by the communicator, its works, its watchdog

// One issued collective: its done event and when it was issued.
struct Pending {
  const char* op = "";
  cudaEvent_t done = nullptr;
  Clock::time_point issued;
  bool all_gather = false;
  ~Pending() {
    if (done) (void)cudaEventDestroy(done);
  }
};

struct GroupState {
  std::shared_ptr<NcclWorld> world;
  std::vector<int> global_ranks;
  std::mutex mu;  // guards everything below and every NCCL call on `comm`
  ncclComm_t comm = nullptr;
  std::deque<std::shared_ptr<Pending>> in_flight;  // oldest first (one stream: they finish in order)
  std::string failure;                              // the first failure, one line; empty while healthy
  std::string failure_op;
  std::vector<int> failure_dead;
  bool failure_reported = false;  // a call threw it (the watchdog need not end the process)
  Clock::time_point failure_at;

  std::vector<int> dead_peers() const;
  // Records the failure (the first one wins) and aborts the communicator:
  // ncclCommAbort makes kernels stuck on a dead peer return. Holds mu.
  void fail_locked(const std::string& op, const std::string& detail, bool peer_just_failed);
  // The failure as `op` reports it: the first report is the failure itself,
  // later calls are refused naming it. Holds mu.
  CommError error_locked(const char* op);
  // Drops the finished collectives from the front. Holds mu.
  void retire_locked();
  // NCCL's asynchronous error and the oldest collective's age. Holds mu.
  void check_health_locked();
  // The host waits for `p`, bounded by the timeout from its issue.
  void host_wait(const Pending& p);
};

}  // namespace shardfit::executor::nccl_detail
