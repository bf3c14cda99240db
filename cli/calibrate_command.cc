// `shardfit calibrate --device cpu [--nproc N] --out FILE`: measures what the
// time model's cpu profile otherwise guesses (issue 11) and writes a
// profile with those figures, for `plan --device FILE` and `run --profile
// FILE`:
//   peak_flops_per_s.{fp32,bf16,fp16}  a square matmul at the size where one
//       takes >= 20 ms (from 256, doubling, at most 2048), with the intra-op
//       threads one of N ranks gets (as `run --nproc N` gives each rank);
//   memory_bytes_per_s (and host memory, host link: the same DRAM)  an
//       out-of-place add of 64 MiB fp32 tensors (3 × 64 MiB moved);
//   gpu_link.bytes_per_s  a gloo all-reduce of 16 MiB fp32 among max(N, 2)
//       ranks (threads of this process over loopback TCP), counted as the
//       time model counts a ring all-reduce: 2(n−1)/n × 16 MiB per rank; the
//       rate is the achieved one, so efficiency.collective becomes 1.
// Each figure is the median of its repetitions (at least 3, and 0.3 s). The
// efficiencies of compute and memory stay the base profile's estimates:
// they stand for what a training step reaches of these rates, which is what
// the report's step_time_error_pct then shows.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "cli/commands.h"
#include "executor/comm.h"
#include "executor/launcher.h"
#include "planner/profile.h"
#include "planner/time_model.h"
#include "reports/machine.h"

namespace shardfit::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `op` over at least 3 runs and at least `min_total_s`.
template <typename Op>
double median_seconds(Op&& op, double min_total_s = 0.3) {
  op();  // warm-up: first-touch allocations, thread pool start
  std::vector<double> t;
  double total = 0;
  while (t.size() < 3 || total < min_total_s) {
    const auto t0 = Clock::now();
    op();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    t.push_back(s);
    total += s;
    if (t.size() >= 50) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Rate {
  double per_s = 0;
  std::string detail;
};

Rate matmul_rate(torch::Dtype dtype) {
  int64_t n = 256;
  for (;;) {
    auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
    const auto t0 = Clock::now();
    torch::mm(a, b);
    const double once = std::chrono::duration<double>(Clock::now() - t0).count();
    if (once >= 0.02 || n >= 2048) break;
    n *= 2;
  }
  auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype), c = torch::empty({n, n}, dtype);
  const double s = median_seconds([&] { torch::mm_out(c, a, b); });
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  char d[96];
  std::snprintf(d, sizeof d, "%lldx%lld matmul, median %.2f ms", static_cast<long long>(n), static_cast<long long>(n),
                s * 1e3);
  return {flops / s, d};
}

Rate memory_rate() {
  const int64_t n = int64_t{16} << 20;  // 64 MiB of fp32
  auto a = torch::rand({n}), b = torch::rand({n}), c = torch::empty({n});
  const double s = median_seconds([&] { torch::add_out(c, a, b); });
  char d[96];
  std::snprintf(d, sizeof d, "add of 64 MiB fp32 tensors (3 x 64 MiB moved), median %.2f ms", s * 1e3);
  return {3.0 * static_cast<double>(n) * 4.0 / s, d};
}

Rate all_reduce_rate(int ranks, int threads_per_rank) {
  const int64_t numel = int64_t{4} << 20;  // 16 MiB of fp32
  const int port = executor::pick_free_port();
  std::vector<double> seconds(static_cast<size_t>(ranks), 0);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> pool;
  for (int r = 0; r < ranks; ++r) {
    pool.emplace_back([&, r] {
      try {
        at::set_num_threads(threads_per_rank);
        executor::CommOptions o;
        o.backend = executor::Backend::kGloo;
        o.rank = r;
        o.world_size = ranks;
        o.master_port = port;
        o.timeout = std::chrono::seconds(60);
        auto comm = executor::make_communicator(o);
        auto t = torch::ones({numel});
        seconds[static_cast<size_t>(r)] = median_seconds([&] { comm->all_reduce(t, executor::ReduceOp::kSum); });
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) throw EnvironmentFailure("calibrate: the gloo all-reduce failed: " + e);
  const double s = *std::max_element(seconds.begin(), seconds.end());
  const double bytes = planner::all_reduce_bytes_per_rank(static_cast<double>(numel) * 4.0, ranks);
  char d[128];
  std::snprintf(d, sizeof d, "gloo all-reduce of 16 MiB fp32 among %d ranks over loopback TCP, median %.2f ms",
                ranks, s * 1e3);
  return {bytes / s, d};
}

std::string today() {
  char buf[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "calibrate", "Measure this machine's matmul, memory and collective rates into a profile (cpu)");
  struct Args {
    std::string device = "cpu", out, base = "cpu", name = "cpu-calibrated";
    int nproc = 1;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--device", a->device, "What to measure: cpu (a CUDA card is calibrated by scripts/gpu-check)")
      ->capture_default_str();
  sub->add_option("--nproc", a->nproc, "Ranks that will share this host's cores (as `run --nproc`)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->add_option("--base", a->base, "The profile whose other figures the result keeps")->capture_default_str();
  sub->add_option("--name", a->name, "The result's profile name")->capture_default_str();
  sub->add_option("--out", a->out, "Where to write the profile JSON")->required();
  return {sub, [a] {
            if (a->device != "cpu")
              throw BadInput("--device " + a->device + ": calibrate measures CPU ranks (cpu); a CUDA card's "
                             "figures come from scripts/gpu-check (reports/gpu/)");
            const planner::DeviceProfile base = [&] {
              try {
                return planner::load_profile(a->base, profiles_dir());
              } catch (const std::invalid_argument& e) {
                throw BadInput(std::string("--base: ") + e.what());
              }
            }();
            if (base.kind != planner::DeviceKind::kCpu)
              throw BadInput("--base " + a->base + ": not a cpu profile");
            const std::string base_path = planner::profile_file(a->base, profiles_dir());
            std::ifstream in(base_path);
            if (!in) throw BadInput("--base " + a->base + ": cannot read " + base_path);
            nlohmann::json p = nlohmann::json::parse(in);

            const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
            const int threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(a->nproc)));
            at::set_num_threads(threads);
            const reports::Machine m = reports::this_machine(threads);
            const std::string where = "measured by `shardfit calibrate --device cpu --nproc " +
                                      std::to_string(a->nproc) + "` on " + today() + ", " + m.cpu_model + ", " +
                                      std::to_string(threads) + " intra-op thread(s) per rank: ";
            std::fprintf(stderr, "calibrate: %s, %d thread(s) per rank\n", m.cpu_model.c_str(), threads);
            auto& src = p["sources"];
            const std::pair<const char*, torch::Dtype> dtypes[] = {
                {"fp32", torch::kFloat}, {"bf16", torch::kBFloat16}, {"fp16", torch::kHalf}};
            for (const auto& [key, dtype] : dtypes) {
              Rate r;
              try {
                r = matmul_rate(dtype);
              } catch (const c10::Error& e) {  // LibTorch 1.13 has no fp16 matmul on the CPU
                src[std::string("peak_flops_per_s.") + key] =
                    "not measurable here (" + std::string(e.what_without_backtrace()).substr(0, 80) + "), " +
                    base.name + "'s figure kept: " + src[std::string("peak_flops_per_s.") + key].get<std::string>();
                std::fprintf(stderr, "calibrate: %s matmul not measurable: %s; %s's figure kept\n", key,
                             e.what_without_backtrace(), base.name.c_str());
                continue;
              }
              p["peak_flops_per_s"][key] = r.per_s;
              src[std::string("peak_flops_per_s.") + key] = where + r.detail;
              std::fprintf(stderr, "calibrate: %s matmul %.1f GFLOP/s (%s)\n", key, r.per_s / 1e9, r.detail.c_str());
            }
            const Rate mem = memory_rate();
            for (const char* key : {"memory_bytes_per_s", "host_memory_bytes_per_s"}) {
              p[key] = mem.per_s;
              src[key] = where + mem.detail;
            }
            p["host_link"]["bytes_per_s"] = mem.per_s;
            src["host_link.bytes_per_s"] = where + mem.detail + " (host and device are the same memory)";
            std::fprintf(stderr, "calibrate: memory %.2f GB/s (%s)\n", mem.per_s / 1e9, mem.detail.c_str());
            const int ranks = std::max(2, a->nproc);
            const Rate link = all_reduce_rate(ranks, std::max(1, static_cast<int>(cores) / ranks));
            p["gpu_link"]["bytes_per_s"] = link.per_s;
            src["gpu_link.bytes_per_s"] = where + link.detail + ", bytes as the time model counts a ring all-reduce";
            p["efficiency"]["collective"] = 1.0;
            src["efficiency.collective"] = "1: gpu_link.bytes_per_s is the rate gloo achieved, measured as above";
            std::fprintf(stderr, "calibrate: gloo all-reduce %.2f GB/s per rank (%s)\n", link.per_s / 1e9,
                         link.detail.c_str());
            p["name"] = a->name;
            p["description"] = "CPU ranks on " + m.cpu_model + ", calibrated by shardfit calibrate on " + today() +
                               " from " + base.name + " (matmul, memory and gloo rates measured; efficiencies as " +
                               base.name + ")";
            std::ofstream out(a->out);
            if (!out) throw BadInput("--out " + a->out + ": cannot write file");
            out << p.dump(2) << "\n";
            out.close();
            planner::load_profile(a->out, profiles_dir());  // what plan and run will read: it must load
            std::printf("wrote %s (profile %s)\n", a->out.c_str(), a->name.c_str());
            return kExitOk;
          }};
}

}  // namespace shardfit::cli
