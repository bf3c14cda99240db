// Helpers shared by the communicator backends (comm.cc, comm_loopback.cc,
// nccl_comm.cc): the text of their one-line errors, who a rank's process is
// (so a survivor can tell which same-host peer died), and the argument
// contracts every backend checks. Internal: not part of comm.h.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <signal.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "executor/comm.h"
#include "executor/watchdog.h"

namespace shardfit::executor::comm_detail {

inline std::string join_ints(const std::vector<int>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

inline std::string seconds_str(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << t.count() / 1000.0 << " s";
  return s.str();
}

// The first line of a library error, without c10's backtrace.
inline std::string error_text(const std::exception& e) {
  std::string what = dynamic_cast<const c10::Error*>(&e)
                         ? static_cast<const c10::Error&>(e).what_without_backtrace()
                         : e.what();
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

// Host name, PID namespace and PID: announced at the rendezvous, so that a
// rank whose peer vanished can look for it in /proc when they share a host.
struct ProcessId {
  std::string host, pid_namespace;
  int pid = 0;
};

inline ProcessId this_process() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  char ns[128];
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  return {host, n > 0 ? std::string(ns, static_cast<size_t>(n)) : "?", static_cast<int>(getpid())};
}

inline std::string encode(const ProcessId& p) {
  return p.host + "\n" + p.pid_namespace + "\n" + std::to_string(p.pid);
}

inline ProcessId decode(const std::vector<uint8_t>& bytes) {
  std::istringstream s(std::string(bytes.begin(), bytes.end()));
  ProcessId p;
  std::string pid;
  std::getline(s, p.host);
  std::getline(s, p.pid_namespace);
  std::getline(s, pid);
  p.pid = std::atoi(pid.c_str());
  return p;
}

// False once the process has exited (gone, zombie or dead in /proc).
inline bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

// A group's rendezvous through the store: each member writes its
// announcement under `key`/joined/<group rank> and waits for all of them,
// bounded by `timeout`; a failure is one CommError naming the ranks that
// never arrived. `what` names the rendezvous in messages. Returns each
// member's announcement, by group rank.
inline std::vector<std::vector<uint8_t>> store_rendezvous(c10d::Store& store, const std::string& what,
                                                          const std::string& key, int group_rank,
                                                          const std::vector<int>& globals, int global_rank,
                                                          std::chrono::milliseconds timeout,
                                                          const std::vector<uint8_t>& announcement) {
  std::vector<std::string> keys;
  for (size_t r = 0; r < globals.size(); ++r) keys.push_back(key + "/joined/" + std::to_string(r));
  const std::string failed = what + " failed on rank " + std::to_string(global_rank);
  try {
    store.set(keys[group_rank], announcement);
  } catch (const std::exception& e) {
    throw CommError(failed + ": cannot write to the store (its host, rank 0, may have exited): " + error_text(e),
                    "rendezvous", {});
  }
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (size_t r = 0; r < keys.size(); ++r)
        if (!store.check({keys[r]})) missing.push_back(globals[r]);
    } catch (const std::exception&) {  // the store itself is gone: say what wait said
    }
    throw CommError(failed + " after " + seconds_str(timeout) + ": " +
                        (missing.empty() ? error_text(e) : "rank(s) " + join_ints(missing) + " never arrived"),
                    "rendezvous", {});
  }
  std::vector<std::vector<uint8_t>> values;
  for (const auto& k : keys) values.push_back(store.get(k));
  return values;
}

// The checks every backend's constructor starts with; `store`: it meets
// its peers through MASTER_ADDR:MASTER_PORT (gloo, nccl).
inline void check_comm_options(const CommOptions& o, bool store) {
  if (o.world_size < 1)
    throw std::invalid_argument("world size " + std::to_string(o.world_size) + ": must be at least 1");
  if (o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("rank " + std::to_string(o.rank) + ": must be in [0, " +
                                std::to_string(o.world_size) + ") for world size " + std::to_string(o.world_size));
  if (o.timeout.count() <= 0)
    throw std::invalid_argument("timeout " + std::to_string(o.timeout.count()) + " ms: must be positive");
  if (store && (o.master_port < 1 || o.master_port > 65535))
    throw std::invalid_argument("MASTER_PORT " + std::to_string(o.master_port) + ": must be in 1..65535");
}

// A peer that dies closes its sockets; writing to them must be an error,
// not SIGPIPE killing this rank (Python, hence torch.distributed, ignores
// SIGPIPE the same way). A handler someone installed is left alone.
inline void ignore_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

inline std::string store_address(const CommOptions& o) {
  return o.master_addr + ":" + std::to_string(o.master_port);
}

// The job's store, every backend's one rendezvous point: a TCPStore at
// MASTER_ADDR:MASTER_PORT hosted by rank 0 (or by the launcher's agent),
// seen through the prefix "<store_prefix>/<name>". Reaching it is bounded
// by the timeout (and the watchdog past it); failing is one CommError.
inline c10::intrusive_ptr<c10d::Store> connect_store(const CommOptions& o, const std::string& name) {
  const bool host_store = o.rank == 0 && !o.store_hosted_by_agent;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(o.master_port);
  options.isServer = host_store;
  options.numWorkers = static_cast<size_t>(o.world_size);
  options.waitWorkers = false;  // the group rendezvous names who is missing
  options.timeout = o.timeout;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    const Watchdog watchdog(o.timeout + kWatchdogGrace, "reaching the store at " + store_address(o));
    tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, options);
  } catch (const std::exception& e) {
    throw CommError("rendezvous failed on rank " + std::to_string(o.rank) + ": " +
                        (host_store ? "cannot host the store at " : "cannot reach the store at ") + store_address(o) +
                        (host_store ? " (is the port in use?)"
                                    : " within " + seconds_str(o.timeout) + " (rank 0 hosts it)") +
                        ": " + error_text(e),
                    "rendezvous", {});
  }
  return c10::make_intrusive<c10d::PrefixStore>((o.store_prefix.empty() ? "" : o.store_prefix + "/") + name, tcp);
}

// ---- argument contracts (programming errors: std::logic_error), shared by
// the loopback, gloo and nccl backends --------------------------------------

inline void check_dense(const char* op, const char* name, const at::Tensor& t) {
  if (!t.defined()) throw std::logic_error(std::string(op) + ": " + name + " is undefined");
  if (!t.is_contiguous())
    throw std::logic_error(std::string(op) + ": " + name + " must be contiguous");
}

// A flat buffer and a shard of it: one dtype and device, world x the
// shard's elements (both backends' check_pair, after their own dense check).
inline void check_pair_shape(const char* op, const char* big_name, const at::Tensor& big, const char* shard_name,
                             const at::Tensor& shard, int world) {
  if (big.scalar_type() != shard.scalar_type() || big.device() != shard.device())
    throw std::logic_error(std::string(op) + ": " + big_name + " and " + shard_name +
                           " differ in dtype or device");
  if (big.numel() != world * shard.numel())
    throw std::logic_error(std::string(op) + ": " + big_name + " has " +
                           std::to_string(big.numel()) + " elements, expected world " +
                           std::to_string(world) + " x " + shard_name + " " +
                           std::to_string(shard.numel()) + " = " +
                           std::to_string(world * shard.numel()) +
                           " (pad the flat buffer to a multiple of the world size)");
}

inline void check_pair(const char* op, const char* big_name, const at::Tensor& big, const char* shard_name,
                       const at::Tensor& shard, int world) {
  check_dense(op, big_name, big);
  check_dense(op, shard_name, shard);
  check_pair_shape(op, big_name, big, shard_name, shard, world);
}

inline void check_avg_dtype(const char* op, const at::Tensor& t, ReduceOp reduce) {
  if (reduce == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type()))
    throw std::logic_error(std::string(op) + ": avg needs a floating dtype");
}

// t *= k, or t /= k, in place without the tensor allocator. With a Scalar
// argument ATen would wrap k into a CPU tensor (8 bytes, plus 4 for its cast
// to float): small, but the meter would see it and the documented costs are
// exact. Off the CPU that wrapped scalar lives on the host, not the device.
inline void scale_in_place(const at::Tensor& t, int k, bool divide) {
  if (!t.device().is_cpu()) {
    divide ? t.div_(k) : t.mul_(k);
    return;
  }
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "scale_in_place", [&] {
    scalar_t* p = t.data_ptr<scalar_t>();
    const auto f = static_cast<scalar_t>(k);
    at::parallel_for(0, t.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      if (divide)
        for (int64_t i = begin; i < end; ++i) p[i] = p[i] / f;
      else
        for (int64_t i = begin; i < end; ++i) p[i] = p[i] * f;
    });
  });
}

// Copies `shard` into `slot` unless it already is that memory (FSDP's
// in-place all-gather keeps the shard as a view of its slot).
inline void place_shard(const char* op, const at::Tensor& slot, const at::Tensor& shard,
                 const at::Tensor& flat) {
  const auto* s = static_cast<const char*>(shard.data_ptr());
  const auto* f = static_cast<const char*>(flat.data_ptr());
  if (s == slot.data_ptr()) return;
  const int64_t flat_bytes = flat.numel() * flat.element_size();
  const int64_t shard_bytes = shard.numel() * shard.element_size();
  if (s < f + flat_bytes && f < s + shard_bytes)
    throw std::logic_error(std::string(op) +
                           ": the input shard overlaps the output but is not this rank's slot");
  slot.copy_(shard);
}

inline std::vector<int> checked_members(const std::vector<int>& ranks, int size, int self) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size)
      throw std::invalid_argument("new_group: rank " + std::to_string(r) +
                                  " is outside the group of " + std::to_string(size));
    if (!seen.insert(r).second)
      throw std::invalid_argument("new_group: rank " + std::to_string(r) + " is listed twice");
  }
  if (!seen.count(self))
    throw std::invalid_argument("new_group: only members create a group; rank " +
                                std::to_string(self) + " is not in {" + join_ints(ranks) + "}");
  return ranks;
}

inline int index_of(const std::vector<int>& v, int x) {
  return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
}

// The loopback backend (comm_loopback.cc): rank `rank` of `world_size`.
std::unique_ptr<Communicator> make_loopback(int rank, int world_size);

}  // namespace shardfit::executor::comm_detail
