// One rank of comm_test's multi-process scenarios, started by
// launch_local: reads its rank from the environment as `shardfit run` does,
// runs one scenario over the gloo backend, and exits 0 when every check
// passed, 1 on a failed check, 3 on a CommError (SPEC's codes).
//
//   comm_test_worker collectives <allreduce|allgather>
//   comm_test_worker groups                 (world 4: two "nodes" of 2)
//   comm_test_worker memory <allreduce|allgather>
//   comm_test_worker die <rank> <seconds>   (that rank exits 7 mid-barrier)
//   comm_test_worker stall <rank> <seconds> (that rank is late for a barrier)
//   comm_test_worker hang <rank>            (that rank ignores SIGTERM, sleeps)
//   comm_test_worker exit <rank> <code>
// The comm timeout is 5 s, or $COMM_TEST_TIMEOUT_MS.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "executor/comm.h"
#include "executor/launcher.h"
#include "tests/executor_comm/counting_allocator.h"

using namespace shardfit::executor;

namespace {

int g_failures = 0;

std::string show(const at::Tensor& t) {
  std::string s = "[";
  auto c = t.to(torch::kDouble).contiguous().view({-1});
  for (int64_t i = 0; i < c.numel() && i < 12; ++i)
    s += (i ? " " : "") + std::to_string(c[i].item<double>());
  return s + (c.numel() > 12 ? " ...]" : "]");
}

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "CHECK FAILED: %s\n", what.c_str());
  ++g_failures;
}

void check_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  check(got.sizes() == want.sizes() && torch::equal(got, want),
        what + ": got " + show(got) + " want " + show(want));
}

at::Tensor arange_f(int64_t n) { return torch::arange(n, torch::kFloat); }

// Exact expected values: small integers and their sums are exact in float.
void run_collectives(Communicator& c) {
  const int w = c.world_size(), r = c.rank();
  const std::string tag = "rank " + std::to_string(r) + "/" + std::to_string(w) + " ";

  // all_gather_into: a 13-element parameter padded to a multiple of w.
  const int64_t numel = 13, shard = (numel + w - 1) / w;
  at::Tensor full = torch::zeros({shard * w});
  full.narrow(0, 0, numel).copy_(arange_f(numel) + 1);  // what every rank's unsharded flat holds
  at::Tensor in = full.narrow(0, r * shard, shard).clone();
  at::Tensor out = torch::full({shard * w}, -1.0f);
  c.all_gather_into(out, in);
  check_equal(out, full, tag + "all_gather_into");
  // In place: the shard is a view of its own slot (FSDP's layout).
  at::Tensor flat = torch::full({shard * w}, -1.0f);
  flat.narrow(0, r * shard, shard).copy_(in);
  c.all_gather_into(flat, flat.narrow(0, r * shard, shard));
  check_equal(flat, full, tag + "all_gather_into in place");

  // reduce_scatter: rank k contributes (k+1) * (j+1) at element j.
  const int64_t n = 4;
  const double ranks_sum = w * (w + 1) / 2.0;  // sum of (k+1)
  at::Tensor sum_flat = (arange_f(n * w) + 1) * static_cast<float>(ranks_sum);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const char* name = op == ReduceOp::kSum ? "sum" : "avg";
    at::Tensor in_flat = (arange_f(n * w) + 1) * static_cast<float>(r + 1);
    at::Tensor out_shard = torch::full({n}, -1.0f);
    c.reduce_scatter(out_shard, in_flat, op);
    at::Tensor want = sum_flat.narrow(0, r * n, n).clone();
    if (op == ReduceOp::kAvg) want.div_(w);
    check_equal(out_shard, want, tag + "reduce_scatter " + name);

    at::Tensor t = (arange_f(n) + 1) * static_cast<float>(r + 1);
    c.all_reduce(t, op);
    at::Tensor want_t = (arange_f(n) + 1) * static_cast<float>(ranks_sum);
    if (op == ReduceOp::kAvg) want_t.div_(w);
    check_equal(t, want_t, tag + "all_reduce " + name);
  }

  // broadcast from the last rank; a 2-D tensor.
  at::Tensor b = torch::full({2, 3}, static_cast<float>(r));
  c.broadcast(b, w - 1);
  check_equal(b, torch::full({2, 3}, static_cast<float>(w - 1)), tag + "broadcast");
  c.barrier();
}

void run_groups(Communicator& world) {
  check(world.world_size() == 4, "groups needs world 4");
  const int g = world.rank();
  HybridGroups hg = make_hybrid_groups(world, 2);
  const int node = g / 2, local = g % 2;
  check(hg.shard->global_ranks() == std::vector<int>{node * 2, node * 2 + 1}, "shard group members");
  check(hg.replicate->global_ranks() == std::vector<int>{local, 2 + local}, "replicate group members");
  check(hg.shard->rank() == local && hg.replicate->rank() == node, "group ranks");

  at::Tensor t = torch::full({3}, static_cast<float>(g));
  hg.shard->all_reduce(t, ReduceOp::kSum);
  check_equal(t, torch::full({3}, static_cast<float>(4 * node + 1)), "shard all_reduce");
  at::Tensor u = torch::full({3}, static_cast<float>(g));
  hg.replicate->all_reduce(u, ReduceOp::kSum);
  check_equal(u, torch::full({3}, static_cast<float>(2 * local + 2)), "replicate all_reduce");

  at::Tensor out = torch::zeros({4});
  hg.shard->all_gather_into(out, torch::full({2}, static_cast<float>(g)));
  check_equal(out, torch::tensor({1.0f * node * 2, 1.0f * node * 2, node * 2 + 1.0f, node * 2 + 1.0f}),
              "shard all_gather_into");

  // The same members twice: a second, independent group.
  auto again = world.new_group({0, 1, 2, 3});
  at::Tensor v = torch::ones({2});
  again->all_reduce(v, ReduceOp::kAvg);
  check_equal(v, torch::ones({2}), "second world-sized group");
  world.barrier();
}

// ---- memory: a counting CPU allocator (tests/executor_comm/counting_allocator.h)

// Each collective's measured extra bytes (peak during the call minus live
// before it) must equal what collective_extra_memory documents: that
// figure is what the planner charges.
void run_memory(Communicator& c, GlooAllGather algo) {
  const Backend backend = c.backend();
  const int w = c.world_size(), r = c.rank();
  const int64_t shard = 1 << 18;  // 1 MiB of float per shard
  const int64_t flat_bytes = shard * w * 4;
  at::Tensor out = torch::zeros({shard * w}), in = torch::ones({shard});
  at::Tensor grad = torch::ones({shard * w}), grad_shard = torch::zeros({shard});
  auto measure = [&](Collective op, int64_t bytes, auto&& call) {
    c.barrier();
    int64_t before = CountingAllocator::instance->reset();
    call();
    int64_t extra = CountingAllocator::instance->peak() - before;
    int64_t want = collective_extra_memory(backend, op, bytes, w, algo).allocator_bytes;
    check(extra == want, "rank " + std::to_string(r) + " " + backend_name(backend) + " " +
                             collective_name(op) + ": measured " + std::to_string(extra) +
                             " extra bytes, documented " + std::to_string(want));
    std::printf("%s %s: %lld extra bytes (documented %lld)\n", backend_name(backend), collective_name(op),
                static_cast<long long>(extra), static_cast<long long>(want));
  };
  measure(Collective::kAllGatherInto, flat_bytes, [&] { c.all_gather_into(out, in); });
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
    measure(Collective::kReduceScatter, flat_bytes, [&] { c.reduce_scatter(grad_shard, grad, op); });
  measure(Collective::kAllReduce, flat_bytes, [&] { c.all_reduce(grad, ReduceOp::kAvg); });
  measure(Collective::kAllReduce, flat_bytes, [&] { c.all_reduce(grad, ReduceOp::kSum); });
  measure(Collective::kBroadcast, flat_bytes, [&] { c.broadcast(out, 0); });
  measure(Collective::kBarrier, 0, [&] { c.barrier(); });
}

int arg_int(int argc, char** argv, int i) {
  if (i >= argc) {
    std::fprintf(stderr, "comm_test_worker: missing argument %d\n", i);
    std::exit(2);
  }
  return std::atoi(argv[i]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_test_worker SCENARIO ...\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const RankEnv env = rank_env_from_environment();
  const char* timeout_env = std::getenv("COMM_TEST_TIMEOUT_MS");
  const std::chrono::milliseconds timeout(timeout_env ? std::atoi(timeout_env) : 5000);

  if (scenario == "hang" || scenario == "exit") {  // launcher-only scenarios: no communicator
    if (env.rank == arg_int(argc, argv, 2)) {
      if (scenario == "exit") return arg_int(argc, argv, 3);
      signal(SIGTERM, SIG_IGN);  // makes the launcher escalate to SIGKILL
      std::printf("rank %d hanging\n", env.rank);
      std::fflush(stdout);
      for (;;) pause();
    }
    return 0;
  }

  CommOptions options = comm_options_for(env, Backend::kGloo, timeout);
  if (argc > 2 && std::string(argv[2]) == "allgather")
    options.gloo_all_gather = GlooAllGather::kViaAllGather;
  if (scenario == "memory") {
    CountingAllocator::instance = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(CountingAllocator::instance, /*priority=*/100);
  }
  try {
    auto comm = make_communicator(options);
    if (scenario == "collectives") {
      run_collectives(*comm);
    } else if (scenario == "groups") {
      run_groups(*comm);
    } else if (scenario == "memory") {
      run_memory(*comm, options.gloo_all_gather);
      CommOptions lo = options;  // the same rank rehearsed by loopback
      lo.backend = Backend::kLoopback;
      run_memory(*make_communicator(lo), options.gloo_all_gather);
    } else if (scenario == "die" || scenario == "stall") {
      comm->barrier();
      const int victim = arg_int(argc, argv, 2);
      if (env.rank == victim) {
        std::this_thread::sleep_for(std::chrono::seconds(arg_int(argc, argv, 3)));
        if (scenario == "stall") return 0;  // never joins the barrier
        std::printf("rank %d exiting now\n", env.rank);
        std::fflush(stdout);
        std::_Exit(7);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        comm->barrier();
        std::printf("barrier completed although rank %d died\n", victim);
        return 1;
      } catch (const CommError& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "CommError after %.2f s: %s\n", s, e.what());
        // A second call fails at once: the communicator is broken.
        try {
          comm->barrier();
        } catch (const CommError& again) {
          std::fprintf(stderr, "then: %s\n", again.what());
        }
        return 3;
      }
    } else {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
  } catch (const CommError& e) {
    std::fprintf(stderr, "CommError: %s\n", e.what());
    return 3;
  }
  if (g_failures) return 1;
  std::printf("ok %s\n", scenario.c_str());
  return 0;
}
