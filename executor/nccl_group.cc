#include "executor/nccl_group.h"

#include <thread>

namespace shardfit::executor::nccl_detail {

using comm_detail::join_ints;
using comm_detail::process_alive;
using comm_detail::ProcessId;
using comm_detail::seconds_str;

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// NCCL's result and, when the communicator has one, its last error message.
std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string("NCCL ") + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += ": " + std::string(last);
  return s;
}

std::vector<int> GroupState::dead_peers() const {
  std::vector<int> dead;
  const auto& procs = world->processes;
  if (procs.empty()) return dead;
  const ProcessId& me = procs[world->global_rank];
  for (int g : global_ranks) {
    if (g == world->global_rank || g >= static_cast<int>(procs.size())) continue;
    const ProcessId& p = procs[g];
    if (p.host == me.host && p.pid_namespace == me.pid_namespace && !process_alive(p.pid)) dead.push_back(g);
  }
  return dead;
}

void GroupState::fail_locked(const std::string& op, const std::string& detail, bool peer_just_failed) {
  if (!failure.empty()) return;
  std::vector<int> dead = dead_peers();
  // A peer's sockets close a moment before /proc shows it exited.
  for (int i = 0; peer_just_failed && dead.empty() && i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dead = dead_peers();
  }
  std::string msg = op + " failed on rank " + std::to_string(world->global_rank);
  if (global_ranks.size() != world->processes.size()) msg += " (group {" + join_ints(global_ranks) + "})";
  msg += dead.empty() ? ": no peer is known to have exited (one may hang or run on another host)"
                      : ": peer rank " + join_ints(dead) + " exited";
  msg += "; " + detail;
  failure = msg;
  failure_op = op;
  failure_dead = dead;
  failure_at = Clock::now();
  if (comm) {
    (void)ncclCommAbort(comm);
    comm = nullptr;
  }
}

CommError GroupState::error_locked(const char* op) {
  if (!failure_reported) {
    failure_reported = true;
    return CommError(failure, failure_op, failure_dead);
  }
  return CommError(std::string(op) + " refused on rank " + std::to_string(world->global_rank) +
                       ": the communicator is broken by an earlier failure: " + failure,
                   op, failure_dead);
}

void GroupState::retire_locked() {
  while (!in_flight.empty() && failure.empty()) {
    cudaError_t q = cudaEventQuery(in_flight.front()->done);
    if (q == cudaErrorNotReady) return;
    if (q != cudaSuccess) {
      fail_locked(in_flight.front()->op, "CUDA " + cuda_error_text(q), false);
      return;
    }
    in_flight.pop_front();
  }
}

void GroupState::check_health_locked() {
  if (!failure.empty()) return;
  retire_locked();
  if (!failure.empty() || !comm) return;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &async);
  if (r != ncclSuccess) async = r;
  if (async != ncclSuccess && async != ncclInProgress) {
    const char* op = in_flight.empty() ? "collective" : in_flight.front()->op;
    fail_locked(op, nccl_error_text(async, comm), async == ncclRemoteError || async == ncclSystemError);
    return;
  }
  if (!in_flight.empty() && Clock::now() - in_flight.front()->issued > world->timeout)
    fail_locked(in_flight.front()->op, "did not complete within " + seconds_str(world->timeout), false);
}

void GroupState::host_wait(const Pending& p) {
  auto sleep = std::chrono::microseconds(20);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!failure.empty()) throw error_locked(p.op);
      cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        fail_locked(p.op, "CUDA " + cuda_error_text(q), false);
        throw error_locked(p.op);
      }
      check_health_locked();
      if (failure.empty() && Clock::now() - p.issued > world->timeout)
        fail_locked(p.op, "did not complete within " + seconds_str(world->timeout), false);
      if (!failure.empty()) throw error_locked(p.op);
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace shardfit::executor::nccl_detail
