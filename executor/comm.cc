// Communicator backends: loopback (one process rehearses rank r's memory)
// and gloo (c10d's ProcessGroupGloo over a TCPStore rendezvous).
#include "executor/comm.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <torch/torch.h>
// Debian's Torch CMake config puts USE_DISTRIBUTED and USE_C10D_GLOO on the
// torch target, so every shardfit target (and the shared PCH) has them.
#ifndef USE_C10D_GLOO
#error "shardfit's gloo backend needs LibTorch built with c10d Gloo (USE_C10D_GLOO)"
#endif
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace shardfit::executor {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kGloo: return "gloo";
    case Backend::kLoopback: return "loopback";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "loopback") return Backend::kLoopback;
  if (name == "nccl") return Backend::kNccl;
  throw std::invalid_argument("--backend " + name + ": unknown backend (choose gloo, nccl or loopback)");
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllGatherInto: return "all_gather_into";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

namespace {

std::string join_ints(const std::vector<int>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string seconds_str(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << t.count() / 1000.0 << " s";
  return s.str();
}

// The first line of a library error, without c10's backtrace.
std::string error_text(const std::exception& e) {
  std::string what = dynamic_cast<const c10::Error*>(&e)
                         ? static_cast<const c10::Error&>(e).what_without_backtrace()
                         : e.what();
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

// ---- argument contracts (programming errors: std::logic_error) ------------

void check_dense(const char* op, const char* name, const at::Tensor& t) {
  if (!t.defined()) throw std::logic_error(std::string(op) + ": " + name + " is undefined");
  if (!t.is_contiguous())
    throw std::logic_error(std::string(op) + ": " + name + " must be contiguous");
}

void check_pair(const char* op, const char* big_name, const at::Tensor& big, const char* shard_name,
                const at::Tensor& shard, int world) {
  check_dense(op, big_name, big);
  check_dense(op, shard_name, shard);
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

void check_avg_dtype(const char* op, const at::Tensor& t, ReduceOp reduce) {
  if (reduce == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type()))
    throw std::logic_error(std::string(op) + ": avg needs a floating dtype");
}

// t *= k, or t /= k, in place without the tensor allocator. With a Scalar
// argument ATen would wrap k into a CPU tensor (8 bytes, plus 4 for its cast
// to float): small, but the meter would see it and the documented costs are
// exact. Off the CPU that wrapped scalar lives on the host, not the device.
void scale_in_place(const at::Tensor& t, int k, bool divide) {
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
void place_shard(const char* op, const at::Tensor& slot, const at::Tensor& shard,
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

std::vector<int> checked_members(const std::vector<int>& ranks, int size, int self) {
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

int index_of(const std::vector<int>& v, int x) {
  return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
}

// ---- loopback --------------------------------------------------------------
// Every collective acts as if all ranks held this rank's inputs. Nothing is
// allocated: copies into slots, in-place multiply.

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(int rank, std::vector<int> global_ranks)
      : rank_(rank), global_ranks_(std::move(global_ranks)) {}

  Backend backend() const override { return Backend::kLoopback; }
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    const char* op = "all_gather_into";
    check_pair(op, "out_flat", out_flat, "in_shard", in_shard, world_size());
    const int64_t n = in_shard.numel();
    at::Tensor out = out_flat.view({-1}), in = in_shard.view({-1});
    place_shard(op, out.narrow(0, rank_ * n, n), in, out);
    at::Tensor own = out.narrow(0, rank_ * n, n);
    for (int r = 0; r < world_size(); ++r)
      if (r != rank_) out.narrow(0, r * n, n).copy_(own);
  }

  void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp reduce) override {
    const char* op = "reduce_scatter";
    check_pair(op, "in_flat", in_flat, "out_shard", out_shard, world_size());
    check_avg_dtype(op, out_shard, reduce);
    const int64_t n = out_shard.numel();
    at::Tensor out = out_shard.view({-1});
    at::Tensor slice = in_flat.view({-1}).narrow(0, rank_ * n, n);
    if (slice.data_ptr() != out.data_ptr()) out.copy_(slice);
    if (reduce == ReduceOp::kSum) scale_in_place(out, world_size(), false);  // N identical contributions
  }

  void all_reduce(const at::Tensor& t, ReduceOp reduce) override {
    check_dense("all_reduce", "t", t);
    check_avg_dtype("all_reduce", t, reduce);
    if (reduce == ReduceOp::kSum) scale_in_place(t, world_size(), false);
  }

  void broadcast(const at::Tensor& t, int root) override {
    check_dense("broadcast", "t", t);
    if (root < 0 || root >= world_size())
      throw std::logic_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                             std::to_string(world_size()));
  }

  void barrier() override {}

  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    checked_members(ranks, world_size(), rank_);
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    return std::make_unique<LoopbackCommunicator>(index_of(ranks, rank_), std::move(globals));
  }

 private:
  int rank_;
  std::vector<int> global_ranks_;
};

// ---- gloo ------------------------------------------------------------------

// Who a rank's process is, so a survivor can tell which same-host peer died:
// host name, PID namespace and PID.
struct ProcessId {
  std::string host, pid_namespace;
  int pid = 0;
};

std::string this_pid_namespace() {
  char buf[128];
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
}

ProcessId this_process() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return {host, this_pid_namespace(), static_cast<int>(getpid())};
}

std::string encode(const ProcessId& p) {
  return p.host + "\n" + p.pid_namespace + "\n" + std::to_string(p.pid);
}

ProcessId decode(const std::vector<uint8_t>& bytes) {
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
bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  char state = line[paren + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// What every communicator of one world shares.
struct GlooWorld {
  c10::intrusive_ptr<c10d::Store> store;  // prefixed; rank 0 (or the agent) hosts the TCPStore
  std::string store_address;              // for messages
  std::chrono::milliseconds timeout{};
  GlooAllGather all_gather_algo = GlooAllGather::kViaAllReduce;
  std::shared_ptr<gloo::transport::Device> device;
  int global_rank = 0;
  std::vector<ProcessId> processes;  // by global rank, filled at the world rendezvous
};

// Members of a group announce themselves under `group_key` and wait for
// each other: the rendezvous, bounded by the timeout and naming who is
// missing. Returns each member's announcement.
std::vector<std::vector<uint8_t>> group_rendezvous(GlooWorld& w, const std::string& group_key,
                                                   int group_rank, const std::vector<int>& globals,
                                                   const std::string& announcement) {
  const std::string what = "rendezvous of group {" + join_ints(globals) + "} at " + w.store_address;
  std::vector<std::string> keys;
  for (size_t r = 0; r < globals.size(); ++r) keys.push_back(group_key + "/joined/" + std::to_string(r));
  try {
    w.store->set(keys[group_rank], bytes_of(announcement));
  } catch (const std::exception& e) {
    throw CommError(what + " failed on rank " + std::to_string(w.global_rank) +
                        ": cannot write to the store (its host, rank 0, may have exited): " + error_text(e),
                    "rendezvous", {});
  }
  try {
    w.store->wait(keys, w.timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (size_t r = 0; r < keys.size(); ++r)
        if (!w.store->check({keys[r]})) missing.push_back(globals[r]);
    } catch (const std::exception&) {
    }
    throw CommError(what + " failed on rank " + std::to_string(w.global_rank) + " after " +
                        seconds_str(w.timeout) + ": " +
                        (missing.empty() ? error_text(e)
                                         : "rank(s) " + join_ints(missing) + " never arrived"),
                    "rendezvous", {});
  }
  std::vector<std::vector<uint8_t>> values;
  for (const auto& k : keys) values.push_back(w.store->get(k));
  return values;
}

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group `name` (unique within the world) as `rank` of `globals`.
  GlooCommunicator(std::shared_ptr<GlooWorld> world, std::string name, int rank, std::vector<int> globals)
      : world_(std::move(world)), name_(std::move(name)), rank_(rank), global_ranks_(std::move(globals)) {
    const std::string key = "group/" + name_;
    auto announcements = group_rendezvous(*world_, key, rank_, global_ranks_, encode(this_process()));
    if (name_ == "world")
      for (const auto& a : announcements) world_->processes.push_back(decode(a));
    if (world_size() == 1) return;  // nothing to talk to: every collective is local
    auto options = c10d::ProcessGroupGloo::Options::create(world_->timeout);
    options->devices.push_back(world_->device);
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(key + "/gloo", world_->store), rank_, world_size(),
          options);
    } catch (const std::exception& e) {
      broken_ = true;
      throw error("rendezvous", "connecting the gloo mesh of group {" + join_ints(global_ranks_) +
                                    "}: " + error_text(e));
    }
  }

  ~GlooCommunicator() override {
    // A broken group may have a worker stuck in the network until gloo's own
    // timeout; ~ProcessGroupGloo would join it. Leak it instead: the process
    // is about to exit anyway.
    if (broken_ && pg_) (void)pg_.release();
  }

  Backend backend() const override { return Backend::kGloo; }
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    const char* op = "all_gather_into";
    check_pair(op, "out_flat", out_flat, "in_shard", in_shard, world_size());
    check_cpu(op, out_flat);
    const int64_t n = in_shard.numel();
    at::Tensor out = out_flat.view({-1}), in = in_shard.view({-1});
    if (world_size() == 1) return place_shard(op, out, in, out);
    if (world_->all_gather_algo == GlooAllGather::kViaAllReduce) {
      // Zeros everywhere but this rank's slot, then sum: every slot ends up
      // holding its owner's shard exactly. No allocation.
      place_shard(op, out.narrow(0, rank_ * n, n), in, out);
      if (rank_ > 0) out.narrow(0, 0, rank_ * n).zero_();
      if (rank_ + 1 < world_size()) out.narrow(0, (rank_ + 1) * n, (world_size() - rank_ - 1) * n).zero_();
      std::vector<at::Tensor> tensors{out};
      run(op, [&] { return pg_->allreduce(tensors); });
    } else {
      // c10d gathers into a flat temporary of out's size, then copies it
      // into these views.
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (int r = 0; r < world_size(); ++r) outputs[0].push_back(out.narrow(0, r * n, n));
      std::vector<at::Tensor> inputs{in};
      run(op, [&] { return pg_->allgather(outputs, inputs); });
    }
  }

  void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp reduce) override {
    const char* op = "reduce_scatter";
    check_pair(op, "in_flat", in_flat, "out_shard", out_shard, world_size());
    check_cpu(op, in_flat);
    check_avg_dtype(op, out_shard, reduce);
    const int64_t n = out_shard.numel();
    at::Tensor flat = in_flat.view({-1}), out = out_shard.view({-1});
    if (world_size() > 1) {
      // c10d 1.13's Gloo has no reduce-scatter: all-reduce the whole input in
      // place (no allocation), then keep this rank's slice.
      std::vector<at::Tensor> tensors{flat};
      run(op, [&] { return pg_->allreduce(tensors); });
    }
    at::Tensor slice = flat.narrow(0, rank_ * n, n);
    if (slice.data_ptr() != out.data_ptr()) out.copy_(slice);
    if (reduce == ReduceOp::kAvg) scale_in_place(out, world_size(), true);
  }

  void all_reduce(const at::Tensor& t, ReduceOp reduce) override {
    const char* op = "all_reduce";
    check_dense(op, "t", t);
    check_cpu(op, t);
    check_avg_dtype(op, t, reduce);
    if (world_size() > 1) {
      std::vector<at::Tensor> tensors{t};
      run(op, [&] { return pg_->allreduce(tensors); });
    }
    if (reduce == ReduceOp::kAvg) scale_in_place(t, world_size(), true);
  }

  void broadcast(const at::Tensor& t, int root) override {
    const char* op = "broadcast";
    check_dense(op, "t", t);
    check_cpu(op, t);
    if (root < 0 || root >= world_size())
      throw std::logic_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                             std::to_string(world_size()));
    if (world_size() == 1) return;
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run(op, [&] { return pg_->broadcast(tensors, options); });
  }

  void barrier() override {
    if (world_size() > 1) run("barrier", [&] { return pg_->barrier(); });
  }

  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    checked_members(ranks, world_size(), rank_);
    throw_if_broken("new_group");
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    // Members create the same groups in the same order, so the n-th group
    // with these members gets the same name on each of them.
    const std::string members = join_ints(globals, ",");
    const std::string name = name_ + "/" + members + "#" + std::to_string(groups_created_[members]++);
    return std::make_unique<GlooCommunicator>(world_, name, index_of(ranks, rank_), std::move(globals));
  }

 private:
  void check_cpu(const char* op, const at::Tensor& t) const {
    if (!t.device().is_cpu())
      throw std::logic_error(std::string(op) + ": the gloo backend takes CPU tensors, got " +
                             t.device().str() + " (use the nccl backend for CUDA)");
  }

  // Issues a c10d call and waits for it within the timeout.
  template <typename Issue>
  void run(const char* op, Issue&& issue) {
    throw_if_broken(op);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = issue();
      work->wait(world_->timeout);
    } catch (const std::exception& e) {
      const bool timed_out = work && !work->isCompleted();
      CommError err =
          timed_out ? error(op, "did not complete within " + seconds_str(world_->timeout), false)
                    : error(op, error_text(e), true);
      broken_ = true;
      first_error_ = err.what();
      first_dead_ = err.dead_ranks();
      throw err;
    }
  }

  void throw_if_broken(const char* op) const {
    if (broken_)
      throw CommError(std::string(op) + " refused on rank " + std::to_string(world_->global_rank) +
                          ": the communicator is broken by an earlier failure: " + first_error_,
                      op, first_dead_);
  }

  // Global ranks of this group's peers whose same-host processes have exited.
  std::vector<int> dead_peers() const {
    std::vector<int> dead;
    const auto& procs = world_->processes;
    if (procs.empty()) return dead;
    const ProcessId& me = procs[world_->global_rank];
    for (int g : global_ranks_) {
      if (g == world_->global_rank || g >= static_cast<int>(procs.size())) continue;
      const ProcessId& p = procs[g];
      if (p.host == me.host && p.pid_namespace == me.pid_namespace && !process_alive(p.pid))
        dead.push_back(g);
    }
    return dead;
  }

  // `peer_just_failed`: the library saw a peer's sockets close, a moment
  // before /proc shows that peer exited: look again briefly before saying
  // no peer is known dead. (After a timeout a dead peer is long dead.)
  CommError error(const std::string& op, const std::string& detail, bool peer_just_failed = false) const {
    std::vector<int> dead = dead_peers();
    for (int i = 0; peer_just_failed && dead.empty() && i < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      dead = dead_peers();
    }
    std::string msg = op + " failed on rank " + std::to_string(world_->global_rank);
    if (global_ranks_.size() != world_->processes.size())
      msg += " (group {" + join_ints(global_ranks_) + "})";
    msg += dead.empty() ? ": no peer is known to have exited (one may hang or run on another host)"
                        : ": peer rank " + join_ints(dead) + " exited";
    msg += "; " + detail;
    return CommError(msg, op, dead);
  }

  std::shared_ptr<GlooWorld> world_;
  std::string name_;
  int rank_;
  std::vector<int> global_ranks_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  bool broken_ = false;
  std::string first_error_;  // the failure that broke it
  std::vector<int> first_dead_;
  std::map<std::string, int> groups_created_;
};

bool is_loopback_address(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::unique_ptr<Communicator> make_gloo(const CommOptions& o) {
  // A peer that dies closes its sockets; writing to them must be an error,
  // not SIGPIPE killing this rank (Python, hence torch.distributed, ignores
  // SIGPIPE the same way).
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

  auto world = std::make_shared<GlooWorld>();
  world->timeout = o.timeout;
  world->all_gather_algo = o.gloo_all_gather;
  world->global_rank = o.rank;
  world->store_address = o.master_addr + ":" + std::to_string(o.master_port);
  const bool host_store = o.rank == 0 && !o.store_hosted_by_agent;
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(o.master_port);
  store_options.isServer = host_store;
  store_options.numWorkers = static_cast<size_t>(o.world_size);
  store_options.waitWorkers = false;  // the group rendezvous below names who is missing
  store_options.timeout = o.timeout;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
  } catch (const std::exception& e) {
    throw CommError("rendezvous failed on rank " + std::to_string(o.rank) + ": " +
                        (host_store ? "cannot host the store at " : "cannot reach the store at ") +
                        world->store_address +
                        (host_store ? " (is the port in use?)" : " within " + seconds_str(o.timeout) +
                                                                     " (rank 0 hosts it)") +
                        ": " + error_text(e),
                    "rendezvous", {});
  }
  const std::string prefix = (o.store_prefix.empty() ? "" : o.store_prefix + "/") + "shardfit";
  world->store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);

  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    world->device = c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  else if (is_loopback_address(o.master_addr))
    world->device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  else
    world->device = c10d::ProcessGroupGloo::createDefaultDevice();

  std::vector<int> globals(static_cast<size_t>(o.world_size));
  for (int r = 0; r < o.world_size; ++r) globals[r] = r;
  return std::make_unique<GlooCommunicator>(world, "world", o.rank, std::move(globals));
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommOptions& o) {
  if (o.world_size < 1)
    throw std::invalid_argument("world size " + std::to_string(o.world_size) + ": must be at least 1");
  if (o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("rank " + std::to_string(o.rank) + ": must be in [0, " +
                                std::to_string(o.world_size) + ") for world size " +
                                std::to_string(o.world_size));
  if (o.timeout.count() <= 0)
    throw std::invalid_argument("timeout " + std::to_string(o.timeout.count()) + " ms: must be positive");
  switch (o.backend) {
    case Backend::kLoopback: {
      std::vector<int> globals(static_cast<size_t>(o.world_size));
      for (int r = 0; r < o.world_size; ++r) globals[r] = r;
      return std::make_unique<LoopbackCommunicator>(o.rank, std::move(globals));
    }
    case Backend::kGloo:
      if (o.master_port < 1 || o.master_port > 65535)
        throw std::invalid_argument("MASTER_PORT " + std::to_string(o.master_port) +
                                    ": must be in 1..65535");
      return make_gloo(o);
    case Backend::kNccl:
      break;
  }
  throw std::invalid_argument(
      "--backend nccl: this build has no CUDA/NCCL backend (use gloo on CPU, or loopback)");
}

HybridGroups make_hybrid_groups(Communicator& world, int shard_group_size) {
  const int w = world.world_size();
  if (shard_group_size < 1 || w % shard_group_size != 0)
    throw std::invalid_argument("shard group size " + std::to_string(shard_group_size) +
                                " does not divide world size " + std::to_string(w) + " (" +
                                std::to_string(w) + " % " + std::to_string(shard_group_size) + " = " +
                                std::to_string(shard_group_size < 1 ? w : w % shard_group_size) + ")");
  const int node = world.rank() / shard_group_size;
  const int local = world.rank() % shard_group_size;
  std::vector<int> shard, replicate;
  for (int i = 0; i < shard_group_size; ++i) shard.push_back(node * shard_group_size + i);
  for (int n = 0; n < w / shard_group_size; ++n) replicate.push_back(n * shard_group_size + local);
  HybridGroups g;
  g.shard = world.new_group(shard);
  g.replicate = world.new_group(replicate);
  return g;
}

}  // namespace shardfit::executor
