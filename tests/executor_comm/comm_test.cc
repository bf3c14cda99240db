// The communication layer and the launcher: loopback collectives in
// process; gloo collectives, sub-groups, measured memory and failures with
// real processes (comm_test_worker, started through launch_local over
// 127.0.0.1 on a free port).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "executor/comm.h"
#include "executor/launcher.h"

namespace shardfit::executor {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- loopback: rank 1 of a world of 3 --------------------------------------

std::unique_ptr<Communicator> loopback(int rank, int world) {
  CommOptions o;
  o.backend = Backend::kLoopback;
  o.rank = rank;
  o.world_size = world;
  return make_communicator(o);
}

TEST(Loopback, AllGatherFillsEverySlotWithTheLocalShard) {
  auto c = loopback(1, 3);
  EXPECT_EQ(c->rank(), 1);
  EXPECT_EQ(c->world_size(), 3);
  // A 10-element parameter padded by the caller to 12 = 3 shards of 4.
  at::Tensor shard = torch::tensor({5.0f, 6.0f, 7.0f, 8.0f});
  at::Tensor out = torch::full({12}, -1.0f);
  c->all_gather_into(out, shard);
  EXPECT_TRUE(torch::equal(out, shard.repeat({3})));
  // In place: the shard is its own slot of the flat buffer.
  at::Tensor flat = torch::zeros({12});
  flat.narrow(0, 4, 4).copy_(shard);
  c->all_gather_into(flat, flat.narrow(0, 4, 4));
  EXPECT_TRUE(torch::equal(flat, shard.repeat({3})));
}

TEST(Loopback, ReduceScatterTakesThisRanksSliceTimesTheWorldForSum) {
  auto c = loopback(1, 3);
  at::Tensor in = torch::arange(12, torch::kFloat);
  at::Tensor out = torch::zeros({4});
  c->reduce_scatter(out, in, ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(out, torch::arange(4, 8, torch::kFloat) * 3));
  c->reduce_scatter(out, in, ReduceOp::kAvg);
  EXPECT_TRUE(torch::equal(out, torch::arange(4, 8, torch::kFloat)));
  EXPECT_TRUE(torch::equal(in, torch::arange(12, torch::kFloat)));  // loopback leaves the input alone
}

TEST(Loopback, AllReduceBroadcastBarrier) {
  auto c = loopback(1, 3);
  at::Tensor t = torch::tensor({1.0f, 2.0f});
  c->all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(t, torch::tensor({3.0f, 6.0f})));
  c->all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(torch::equal(t, torch::tensor({3.0f, 6.0f})));
  c->broadcast(t, 2);
  EXPECT_TRUE(torch::equal(t, torch::tensor({3.0f, 6.0f})));
  c->barrier();
  EXPECT_THROW(c->broadcast(t, 3), std::logic_error);
}

TEST(Loopback, UnequalShardsAreRejectedWithTheArithmetic) {
  auto c = loopback(1, 3);
  at::Tensor out = torch::zeros({10});
  try {
    c->all_gather_into(out, torch::zeros({4}));
    FAIL() << "expected a logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("world 3 x in_shard 4 = 12"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->reduce_scatter(torch::zeros({3}), torch::zeros({10}), ReduceOp::kSum), std::logic_error);
  EXPECT_THROW(c->all_gather_into(torch::zeros({12}, torch::kDouble), torch::zeros({4})), std::logic_error);
}

TEST(Loopback, HybridGroupsOfWorld4) {
  auto c = loopback(3, 4);
  HybridGroups g = make_hybrid_groups(*c, 2);
  EXPECT_EQ(g.shard->global_ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(g.shard->rank(), 1);
  EXPECT_EQ(g.replicate->global_ranks(), (std::vector<int>{1, 3}));
  EXPECT_EQ(g.replicate->rank(), 1);
  at::Tensor t = torch::ones({2});
  g.shard->all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(t, torch::full({2}, 2.0f)));
  EXPECT_THROW(make_hybrid_groups(*c, 3), std::invalid_argument);
  EXPECT_THROW(c->new_group({0, 1}), std::invalid_argument);  // rank 3 is not a member
}

TEST(Comm, DocumentedExtraMemory) {
  const int64_t mib = 1 << 20;
  auto gloo = [&](Collective op, GlooAllGather a) {
    return collective_extra_memory(Backend::kGloo, op, 8 * mib, 4, a);
  };
  EXPECT_EQ(gloo(Collective::kAllGatherInto, GlooAllGather::kViaAllGather).allocator_bytes, 8 * mib);
  EXPECT_EQ(gloo(Collective::kAllGatherInto, GlooAllGather::kViaAllReduce).allocator_bytes, 0);
  EXPECT_EQ(gloo(Collective::kAllGatherInto, GlooAllGather::kViaAllReduce).library_host_bytes_max, 2 * mib);
  EXPECT_EQ(gloo(Collective::kReduceScatter, GlooAllGather::kViaAllGather).allocator_bytes, 0);
  EXPECT_EQ(gloo(Collective::kBroadcast, GlooAllGather::kViaAllGather).library_host_bytes_max, 0);
  EXPECT_EQ(
      collective_extra_memory(Backend::kLoopback, Collective::kAllGatherInto, 8 * mib, 4).allocator_bytes,
      0);
  EXPECT_EQ(collective_extra_memory(Backend::kGloo, Collective::kAllGatherInto, 8 * mib, 1,
                                    GlooAllGather::kViaAllGather)
                .allocator_bytes,
            0);
}

TEST(Comm, FactoryRejectsImpossibleOptions) {
  CommOptions o;
  o.backend = Backend::kLoopback;
  o.rank = 3;
  o.world_size = 3;
  EXPECT_THROW(make_communicator(o), std::invalid_argument);
  o.rank = 0;
  o.backend = Backend::kNccl;
  EXPECT_THROW(make_communicator(o), std::invalid_argument);
  EXPECT_THROW(parse_backend("mpi"), std::invalid_argument);
  EXPECT_EQ(parse_backend("gloo"), Backend::kGloo);
}

// ---- gloo rendezvous in this process ---------------------------------------

TEST(GlooRendezvous, TimesOutNamingTheRanksThatNeverArrived) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 3;
  o.master_port = pick_free_port();
  o.timeout = milliseconds(1000);
  const auto start = std::chrono::steady_clock::now();
  try {
    make_communicator(o);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "rendezvous");
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 never arrived"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

TEST(GlooRendezvous, ClientWithoutAStoreTimesOut) {
  CommOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.master_port = pick_free_port();
  o.timeout = milliseconds(1000);
  const auto start = std::chrono::steady_clock::now();
  try {
    make_communicator(o);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the store"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

// ---- the environment contract ----------------------------------------------

class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, const char*>> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      if (v) setenv(k.c_str(), v, 1); else unsetenv(k.c_str());
    }
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_)
      if (v) setenv(k.c_str(), v->c_str(), 1); else unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(RankEnv, ReadsTorchrunsVariables) {
  ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29501"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "1"}});
  RankEnv e = rank_env_from_environment();
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29501);
  EXPECT_TRUE(e.store_hosted_by_agent);
  EXPECT_EQ(e.store_prefix, "/worker/attempt_1");
}

TEST(RankEnv, MissingOrBadVariablesAreNamed) {
  auto message = [] {
    try {
      rank_env_from_environment();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    ScopedEnv env({{"RANK", nullptr}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    EXPECT_EQ(message().rfind("RANK is not set", 0), 0u) << message();
  }
  {
    ScopedEnv env({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    EXPECT_EQ(message().rfind("RANK=x1: not an integer", 0), 0u) << message();
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    EXPECT_EQ(message().rfind("RANK=2: must be in 0..1", 0), 0u) << message();
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "70000"}});
    EXPECT_EQ(message().rfind("MASTER_PORT=70000", 0), 0u) << message();
  }
}

TEST(Launcher, ArgvAndReportPaths) {
  EXPECT_EQ(without_nproc_option({"shardfit", "run", "--nproc", "4", "--model", "gpt2", "--nproc=2"}),
            (std::vector<std::string>{"shardfit", "run", "--model", "gpt2"}));
  EXPECT_EQ(rank_report_paths("out/run.json", 2),
            (std::vector<std::string>{"out/run.rank0.json", "out/run.rank1.json"}));
  EXPECT_EQ(rank_report_path("run", 3), "run.rank3.json");
}

// ---- multi-process, through the launcher -------------------------------------

std::string worker_path() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(".");
  return dir.substr(0, dir.rfind('/')) + "/comm_test_worker";
}

struct Captured {
  std::mutex mu;
  std::vector<std::string> lines;
  bool contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
  std::string line_starting(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& l : lines)
      if (l.rfind(prefix, 0) == 0) return l;
    return {};
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mu);
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

LaunchResult launch(int nproc, std::vector<std::string> args, Captured& out, LaunchOptions o = {}) {
  o.executable = worker_path();
  if (o.timeout == LaunchOptions{}.timeout) o.timeout = seconds(60);
  o.kill_grace = milliseconds(1000);
  o.on_line = [&out](int rank, bool is_stderr, const std::string& line) {
    std::lock_guard<std::mutex> lock(out.mu);
    out.lines.push_back("[rank " + std::to_string(rank) + (is_stderr ? " err] " : "] ") + line);
  };
  args.insert(args.begin(), "comm_test_worker");
  return launch_local(nproc, args, o);
}

void expect_all_ok(const LaunchResult& r, Captured& out, int nproc, const std::string& scenario) {
  EXPECT_EQ(r.exit_code, 0) << r.error << "\n" << out.all();
  for (int k = 0; k < nproc; ++k)
    EXPECT_TRUE(out.contains("[rank " + std::to_string(k) + "] ok " + scenario)) << out.all();
}

TEST(Gloo, CollectivesWithTwoRanks) {
  Captured out;
  expect_all_ok(launch(2, {"collectives", "allreduce"}, out), out, 2, "collectives");
}

TEST(Gloo, CollectivesWithThreeRanks) {
  Captured out;
  expect_all_ok(launch(3, {"collectives", "allreduce"}, out), out, 3, "collectives");
}

TEST(Gloo, CollectivesWithThreeRanksC10dAllGather) {
  Captured out;
  expect_all_ok(launch(3, {"collectives", "allgather"}, out), out, 3, "collectives");
}

TEST(Gloo, HybridSubGroupsOfWorld4) {
  Captured out;
  expect_all_ok(launch(4, {"groups"}, out), out, 4, "groups");
}

TEST(Gloo, MeasuredExtraMemoryIsTheDocumentedOne) {
  for (const char* algo : {"allreduce", "allgather"}) {
    Captured out;
    expect_all_ok(launch(2, {"memory", algo}, out), out, 2, "memory");
  }
}

TEST(Failure, ADeadRankFailsEveryCollectiveWithinTheTimeoutAndIsNamed) {
  Captured out;
  LaunchOptions o;
  o.survivor_grace = seconds(10);  // let the survivors fail on their own
  const auto start = std::chrono::steady_clock::now();
  LaunchResult r = launch(3, {"die", "1", "3"}, out, o);
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << out.all();
  // Rank 1 died; 0 and 2 then failed on their own: rank 1 is named first.
  EXPECT_EQ(r.failed_ranks.front(), 1);
  EXPECT_EQ(r.error.rfind("rank 1 exited with code 7, rank ", 0), 0u) << r.error;
  for (int k : {0, 2}) {
    // Each survivor's barrier failed on its own (comm timeout 5 s), naming rank 1.
    EXPECT_EQ(r.ranks[k].how, RankExit::How::kExited) << r.error;
    EXPECT_EQ(r.ranks[k].code, 3) << out.all();
    EXPECT_TRUE(out.contains("[rank " + std::to_string(k) + " err] CommError after")) << out.all();
    EXPECT_TRUE(out.contains("[rank " + std::to_string(k) + " err] then: barrier refused")) << out.all();
  }
  EXPECT_TRUE(out.contains("peer rank 1 exited")) << out.all();
  EXPECT_LT(elapsed_s, 3 + 5 + 4) << out.all();  // death at 3 s + comm timeout + start-up slack
}

TEST(Failure, ALateRankMakesTheOthersTimeOut) {
  ScopedEnv env{{"COMM_TEST_TIMEOUT_MS", "2000"}};
  Captured out;
  LaunchOptions o;
  o.survivor_grace = seconds(1);
  LaunchResult r = launch(3, {"stall", "1", "6"}, out, o);
  EXPECT_EQ(r.exit_code, 3) << out.all();
  // The others fail at their 2 s timeout; rank 1, still sleeping, is stopped.
  std::vector<int> failed = r.failed_ranks;
  std::sort(failed.begin(), failed.end());
  EXPECT_EQ(failed, (std::vector<int>{0, 2})) << r.error;
  EXPECT_EQ(r.ranks[1].how, RankExit::How::kStopped) << r.error;
  // Each survivor fails at about its timeout, never before it: the late rank
  // is not taken for a dead one. Which survivor times out first is a race:
  // that one knows of no exited peer; the other may fail on its own timeout
  // too, or a moment later when the first one's exit closes its sockets
  // (then naming it, after polling /proc for up to 0.5 s: comm.cc's error()).
  int timed_out_first = 0;
  for (int k : {0, 2}) {
    const std::string prefix = "[rank " + std::to_string(k) + " err] CommError after ";
    const std::string line = out.line_starting(prefix);
    ASSERT_FALSE(line.empty()) << out.all();
    const double s = std::stod(line.substr(prefix.size()));
    EXPECT_GE(s, 1.95) << line;
    EXPECT_LT(s, 3.0) << line;
    EXPECT_NE(line.find("barrier failed on rank " + std::to_string(k)), std::string::npos) << line;
    if (line.find("no peer is known to have exited") != std::string::npos &&
        line.find("did not complete within 2 s") != std::string::npos)
      ++timed_out_first;
  }
  EXPECT_GE(timed_out_first, 1) << out.all();
}

TEST(Failure, TheLauncherStopsTheOthersAtOnceByDefault) {
  Captured out;
  const auto start = std::chrono::steady_clock::now();
  LaunchResult r = launch(3, {"die", "2", "1"}, out);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed_ranks, std::vector<int>{2});
  EXPECT_EQ(r.ranks[0].how, RankExit::How::kStopped);
  EXPECT_NE(r.error.find("rank 2 exited with code 7; stopped rank(s) 0, 1"), std::string::npos) << r.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

TEST(Failure, AHungRankIsKilledAtTheLauncherTimeout) {
  Captured out;
  LaunchOptions o;
  // Long enough for rank 0 to start (load LibTorch) and exit on a loaded
  // 2-core VM: at 2 s it sometimes was still starting when the timeout came.
  o.timeout = seconds(8);
  const auto start = std::chrono::steady_clock::now();
  LaunchResult r = launch(2, {"hang", "1"}, out, o);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed_ranks, std::vector<int>{1});
  EXPECT_EQ(r.ranks[0].how, RankExit::How::kExited);
  EXPECT_EQ(r.ranks[1].how, RankExit::How::kStopped);
  EXPECT_EQ(r.ranks[1].code, SIGKILL);  // it ignored SIGTERM
  EXPECT_NE(r.error.find("timed out after 8 s: rank(s) 1 still running"), std::string::npos) << r.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(12));
}

TEST(Failure, ARanksOwnVerdictIsPassedOn) {
  Captured out;
  LaunchResult r = launch(2, {"exit", "0", "2"}, out);
  EXPECT_EQ(r.exit_code, 2) << r.error;
  EXPECT_NE(r.error.find("rank 0 exited with code 2"), std::string::npos) << r.error;
}

TEST(Failure, AProgramThatCannotStart) {
  Captured out;
  LaunchOptions o;
  o.executable = "/nonexistent/shardfit";
  LaunchResult r = launch_local(2, {"shardfit"}, o);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.error.find("exited with code 127"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace shardfit::executor
