#include "launch/calibrate.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/comm.h"
#include "executor/launcher.h"
#include "launch/child_process.h"
#include "launch/project_python.h"
#include "planner/profile.h"
#include "planner/time_model.h"
#include "reports/machine.h"
#include "spec/errors.h"

namespace shardfit::launch {
namespace {

using spec::BadInput;
using spec::EnvironmentFailure;
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

// The same over exactly `calls` timed calls (after one warm-up): for a
// collective, whose ranks must all call it equally often. Stopping on each
// rank's own clock, as median_seconds does, let one rank leave while the
// other waited in one more all-reduce ("Connection closed by peer").
template <typename Op>
double median_seconds_of(Op&& op, int calls) {
  op();
  std::vector<double> t;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    op();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
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
    torch::mm(a, b);  // not timed: a library's first call sets up (oneDNN's bf16 took 20 ms at 256)
    const auto t0 = Clock::now();
    torch::mm(a, b);
    const double once = std::chrono::duration<double>(Clock::now() - t0).count();
    if (once >= 0.02 || n >= 2048) break;
    n *= 2;
  }
  auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype),
       c = torch::empty({n, n}, dtype);
  const double s = median_seconds([&] { torch::mm_out(c, a, b); });
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  char d[96];
  std::snprintf(d, sizeof d, "%lldx%lld matmul, median %.2f ms", static_cast<long long>(n),
                static_cast<long long>(n), s * 1e3);
  return {flops / s, d};
}

// Seconds of one call of `op`, the median of samples of >= 1 ms each (a
// small kernel runs many times per sample, so the clock's resolution and
// its own cost stay out).
template <typename Op>
double seconds_per_call(Op&& op) {
  op();
  const auto t0 = Clock::now();
  op();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  const int calls = static_cast<int>(std::clamp(1e-3 / std::max(once, 1e-9), 1.0, 100000.0));
  return median_seconds(
             [&] {
               for (int i = 0; i < calls; ++i) op();
             },
             0.02) /
         calls;
}

// The grid of matrix products the time model interpolates in
// (MeasuredKernels): every (m, n, k) of these sizes, m x k times k x n.
const std::vector<int64_t> kGemmDims = {16, 64, 256, 1024};

std::vector<double> matmul_grid_rates(torch::Dtype dtype) {
  std::vector<double> rates;
  for (int64_t m : kGemmDims)
    for (int64_t n : kGemmDims)
      for (int64_t k : kGemmDims) {
        auto a = torch::randn({m, k}).to(dtype), b = torch::randn({k, n}).to(dtype),
             c = torch::empty({m, n}, dtype);
        const double s = seconds_per_call([&] { torch::mm_out(c, a, b); });
        rates.push_back(2.0 * static_cast<double>(m) * static_cast<double>(n) *
                        static_cast<double>(k) / s);
      }
  return rates;
}

// What the time model charges each op beside its bytes: a chain of small
// multiplications recorded by autograd, then its backward, divided by the
// ops the trace recorder counts for it (PhaseWork::ops): per link a mul
// kernel in forward, and in backward a MulBackward0 node and its mul kernel.
double op_overhead_seconds() {
  constexpr int kLinks = 200;
  auto x = torch::randn({64}, torch::requires_grad());
  const double s = seconds_per_call([&] {
    at::Tensor y = x;
    for (int i = 0; i < kLinks; ++i) y = y * 1.0001;
    y.backward(torch::ones_like(y));
  });
  return s / (3.0 * kLinks);
}

// The compute-bound kernels a transformer step runs (random numbers,
// transcendentals, row reductions), each timed on 2^20 elements of `dtype`
// (a 1024 x 1024 matrix), in bytes moved per second as the trace recorder
// counts them: its tensor inputs plus its outputs (KernelWork). Per dtype:
// their cost is per element, so a bf16 kernel moves half the bytes in about
// the same time. The step's other kernels (adds, copies) run at the memory
// bandwidth. A kernel LibTorch lacks for `dtype` is left out.
std::vector<std::pair<std::string, double>> kernel_rates(torch::Dtype dtype) {
  constexpr int64_t kRows = 1024, kCols = 1024;
  const double N = static_cast<double>(kRows * kCols),
               F = N * static_cast<double>(c10::elementSize(dtype));
  auto x = torch::randn({kRows, kCols}).to(dtype), g = torch::randn({kRows, kCols}).to(dtype);
  auto y = torch::softmax(x, -1);
  auto w = torch::ones({kCols}, dtype), b = torch::zeros({kCols}, dtype);
  const double row_stats = 2.0 * kRows * 4;  // layer norm's mean and rstd
  struct Bench {
    const char* op;
    double bytes;
    std::function<void()> run;
  };
  at::Tensor mask, mean, rstd, drop_out = x.clone();
  const std::vector<Bench> benches = {
      {"aten::native_dropout", F + F + N,
       [&] { mask = std::get<1>(at::native_dropout(x, 0.1, true)); }},
      {"aten::native_dropout_backward", F + N + F,
       [&] { at::native_dropout_backward(g, mask, 1 / 0.9); }},
      {"aten::bernoulli_", F, [&] { drop_out.bernoulli_(0.9); }},
      {"aten::gelu", 2 * F, [&] { at::gelu(x, "tanh"); }},
      {"aten::gelu_backward", 3 * F, [&] { at::gelu_backward(g, x, "tanh"); }},
      {"aten::tanh", 2 * F, [&] { at::tanh(x); }},
      {"aten::tanh_backward", 3 * F, [&] { at::tanh_backward(g, y); }},
      {"aten::exp", 2 * F, [&] { at::exp(x); }},
      {"aten::_softmax", 2 * F, [&] { at::_softmax(x, -1, false); }},
      {"aten::_softmax_backward_data", 3 * F, [&] { at::_softmax_backward_data(g, y, -1, dtype); }},
      {"aten::_log_softmax", 2 * F, [&] { at::_log_softmax(x, -1, false); }},
      {"aten::_log_softmax_backward_data", 3 * F,
       [&] { at::_log_softmax_backward_data(g, y, -1, dtype); }},
      {"aten::native_layer_norm", 2 * F + row_stats,
       [&] { std::tie(std::ignore, mean, rstd) = at::native_layer_norm(x, {kCols}, w, b, 1e-5); }},
      {"aten::native_layer_norm_backward", 3 * F + row_stats + F,
       [&] {
         at::native_layer_norm_backward(g, x, {kCols}, mean, rstd, w, b, {true, true, true});
       }},
  };
  std::vector<std::pair<std::string, double>> out;
  for (const Bench& bench : benches) {
    try {
      out.emplace_back(bench.op, bench.bytes / seconds_per_call(bench.run));
    } catch (const c10::Error& e) {  // e.g. a kernel 1.13 has no CPU version of for this dtype
      std::fprintf(stderr, "calibrate: %s not measurable in %s: %s\n", bench.op,
                   c10::toString(dtype), e.what_without_backtrace());
    }
  }
  return out;
}

Rate memory_rate() {
  const int64_t n = int64_t{16} << 20;  // 64 MiB of fp32
  auto a = torch::rand({n}), b = torch::rand({n}), c = torch::empty({n});
  const double s = median_seconds([&] { torch::add_out(c, a, b); });
  char d[96];
  std::snprintf(d, sizeof d, "add of 64 MiB fp32 tensors (3 x 64 MiB moved), median %.2f ms",
                s * 1e3);
  return {3.0 * static_cast<double>(n) * 4.0 / s, d};
}

// Median seconds of a gloo all-reduce of `numel` fp32 among `ranks` threads
// of this process over loopback TCP (the slowest rank's).
double all_reduce_seconds(int ranks, int threads_per_rank, int64_t numel) {
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
        // 21 calls: about 0.3 s of a 16 MiB all-reduce on loopback, as the
        // other benchmarks run for.
        seconds[static_cast<size_t>(r)] =
            median_seconds_of([&] { comm->all_reduce(t, executor::ReduceOp::kSum); }, 21);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) throw EnvironmentFailure("calibrate: the gloo all-reduce failed: " + e);
  return *std::max_element(seconds.begin(), seconds.end());
}

// The rate beyond the fixed `latency_s` (the time model adds both).
Rate all_reduce_rate(int ranks, int threads_per_rank, double latency_s) {
  const int64_t numel = int64_t{4} << 20;  // 16 MiB of fp32
  const double s = all_reduce_seconds(ranks, threads_per_rank, numel);
  const double bytes = planner::all_reduce_bytes_per_rank(static_cast<double>(numel) * 4.0, ranks);
  char d[160];
  std::snprintf(
      d, sizeof d,
      "gloo all-reduce of 16 MiB fp32 among %d ranks over loopback TCP, median %.2f ms less the "
      "latency %.3f ms",
      ranks, s * 1e3, latency_s * 1e3);
  return {bytes / std::max(s - latency_s, s / 2), d};
}

// glibc's malloc maps a block at or above its mmap threshold afresh, every
// page faulted on first touch (microseconds a page), and raises
// the threshold to the size of a mapped block when it is freed, up to 32 MiB
// (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: glibc malloc.c, free()'s "dynamic
// mmap threshold"). A fresh process starts at 128 KiB, so a 4 MiB benchmark
// output was mapped and faulted on every call or recycled from the heap,
// depending on what had been freed before: the same native_dropout_backward
// measured 0.77 and 2.34 ms a call in one Python process before and after
// a 16 MiB block had been freed. A training job has freed its large blocks
// from the first step on; calibrate starts from that state: one 24 MiB block
// allocated, touched and freed, so every output below it comes from the
// heap, as a step's activations do once the job runs. Blocks above 32 MiB
// are mapped afresh either way.
void settle_malloc() {
  auto block = torch::empty({int64_t{24} << 20}, torch::kUInt8);
  block.fill_(0);
}

std::string today() {
  char buf[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// One progress line to `note`, printf-style, its trailing newline dropped.
[[gnu::format(printf, 2, 3)]] void say(const std::function<void(const std::string&)>& note,
                                       const char* format, ...) {
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::string text = line;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (note) note(text);
}

// --stack pytorch: what torch.optim.AdamW's step costs to dispatch, over
// plain tensors and over FSDP2's DTensors, and what FSDP1's and FSDP2's
// hooks, DDP's, and ZeroRedundancyOptimizer's broadcasts cost on `ranks`
// ranks (pytorch/calibrate_stack.py, run by the project's Python with
// `threads` intra-op threads a rank). BadInput when it cannot run: no
// Python with torch, or the script missing.
nlohmann::json stack_probe(int threads, int ranks) {
  std::string python, script;
  try {
    python = project_python();
    script = project_script("calibrate_stack.py");
  } catch (const ProjectPythonMissing& e) {
    throw BadInput(std::string("--stack pytorch: ") + e.what());
  }
  std::string dir = (std::filesystem::temp_directory_path() / "shardfit-calibrate-XXXXXX").string();
  if (!mkdtemp(dir.data())) throw EnvironmentFailure("cannot make a temporary directory (" + dir + ")");
  const std::string out = dir + "/stack.json", log = dir + "/probe.log";
  const int status = run_child({python, script, "--threads", std::to_string(threads), "--nproc",
                                std::to_string(ranks), "--out", out},
                               log)
                         .status;
  std::ifstream result(out);
  const std::string last = last_line(log);  // the probe's last words
  const nlohmann::json j =
      status == 0 && result ? nlohmann::json::parse(result, nullptr, false) : nlohmann::json();
  std::filesystem::remove_all(dir);
  if (!j.is_object() || !j.contains("adamw_steps") || !j.contains("fsdp1_hooks") || !j.contains("fsdp2_hooks") ||
      !j.contains("broadcast_s") || !j["broadcast_s"].is_number() || !j.contains("ddp_hooks") ||
      !j.contains("ddp_buffers_s") || !j["ddp_buffers_s"].is_number())
    throw BadInput("--stack pytorch: " + python + " " + script + " exited " + std::to_string(status) + ": " +
                   (last.empty() ? "no output" : last) + " (it needs the pinned stack's torch: scripts/install-deps)");
  return j;
}

// The sources of a probe's table of lines, {outer: {inner: {figure:
// seconds}}} under `field`: each figure's is what was run, `how(outer,
// inner)`, then how that figure comes from it.
void source_lines(nlohmann::json& src, const std::string& field, const nlohmann::json& table,
                  const std::function<std::string(const std::string&, const std::string&)>& how,
                  const std::vector<std::pair<std::string, std::string>>& derivations) {
  for (const auto& [outer, inners] : table.items())
    for (const auto& [inner, line] : inners.items())
      for (const auto& [figure, derivation] : derivations)
        src[field + "." + outer + "." + inner + "." + figure] = how(outer, inner) + derivation;
}

}  // namespace

nlohmann::json calibrate_cpu(const CalibrateRequest& req,
                             const std::function<void(const std::string&)>& note) {
  const planner::DeviceProfile base = [&] {
    try {
      return planner::load_profile(req.base, req.profiles_dir);
    } catch (const std::invalid_argument& e) {
      throw BadInput(std::string("--base: ") + e.what());
    }
  }();
  if (base.kind != planner::DeviceKind::kCpu)
    throw BadInput("--base " + req.base + ": not a cpu profile");
  const std::string base_path = planner::profile_file(req.base, req.profiles_dir);
  std::ifstream in(base_path);
  if (!in) throw BadInput("--base " + req.base + ": cannot read " + base_path);
  nlohmann::json p = nlohmann::json::parse(in);

  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(req.nproc)));
  at::set_num_threads(threads);
  settle_malloc();
  const reports::Machine m = reports::this_machine(threads);
  const std::string where = "measured by `shardfit calibrate --device cpu --nproc " + std::to_string(req.nproc) +
                            (req.pytorch ? " --stack pytorch" : "") + "` on " + today() + ", " + m.cpu_model +
                            ", LibTorch " + TORCH_VERSION + ", " + std::to_string(threads) +
                            " intra-op thread(s) per rank: ";
  say(note, "calibrate: %s, %d thread(s) per rank\n", m.cpu_model.c_str(), threads);
  auto& src = p["sources"];
  nlohmann::json kernels = nlohmann::json::object();
  if (req.pytorch) {  // first: it fails fast where there is no PyTorch
    // FSDP's collectives need two ranks: --nproc 1 is probed on 2.
    const int ranks = std::max(2, req.nproc);
    const nlohmann::json probe = stack_probe(threads, ranks);
    kernels["adamw_steps"] = probe["adamw_steps"];
    const std::string script = where + "pytorch/calibrate_stack.py (torch " + probe.value("torch", "?") + ")";
    source_lines(src, "measured_kernels.adamw_steps", probe["adamw_steps"],
                 [&](const std::string& step, const std::string& kind) {
                   return script + ": AdamW " + step + " over " + kind +
                          "s of 64 to 126 fp32: 1, 32 of one shape, 32 of 32 shapes; ";
                 },
                 {{"fixed_s", "what is left of the first"},
                  {"per_tensor_s", "the second less the first, over 31"},
                  {"per_shape_s", "the third less the second, over 31"}});
    for (int version : {1, 2}) {
      const std::string table = "fsdp" + std::to_string(version) + "_hooks";
      kernels[table] = probe[table];
      source_lines(src, "measured_kernels." + table, probe[table],
                   [&](const std::string& sharding, const std::string& phase) {
                     const bool zero3 = sharding == "zero3";
                     const std::string wrap =
                         version == 2 ? std::string("fully_shard(reshard_after_forward=") +
                                            (zero3 ? "True" : "False") + ") on each group, then the root"
                                      : std::string("FullyShardedDataParallel(") +
                                            (zero3 ? "FULL_SHARD" : "SHARD_GRAD_OP") + ", a unit a group)";
                     return script + " on " + std::to_string(ranks) + " Gloo ranks: what " + wrap + " adds to a " +
                            phase + ", collectives included, over groups of bias-free Linear(64, 64): 1 of 1, " +
                            "8 of 1, 8 of 8; ";
                   },
                   {{"fixed_s", "what is left of the first"},
                    {"per_group_s", "the second less the first, over 7"},
                    {"per_param_s", "the third less the second, over 56"}});
    }
    kernels["ddp_hooks"] = probe["ddp_hooks"];
    source_lines(src, "measured_kernels.ddp_hooks", probe["ddp_hooks"],
                 [&](const std::string& mode, const std::string& phase) {
                   return script + " on " + std::to_string(ranks) +
                          " Gloo ranks: what DistributedDataParallel(gradient_as_bucket_view=" +
                          (mode == "view" ? "True" : "False") + ") adds to a " + phase +
                          ", its all-reduces included, over bias-free Linear(64, 64): 1 in 1 bucket, 32 in 1, " +
                          "32 in 32 (bucket_cap_mb=1/64); ";
                 },
                 {{"fixed_s", "what is left of the first"},
                  {"per_param_s", "the second less the first, over 31"},
                  {"per_bucket_s", "the third less the second, over 31"}});
    kernels["ddp_buffers_s"] = probe["ddp_buffers_s"];
    src["measured_kernels.ddp_buffers_s"] =
        script + " on " + std::to_string(ranks) + " Gloo ranks: what one 64-element buffer adds to a " +
        "DistributedDataParallel forward (its broadcast from rank 0, broadcast_buffers=True), median of 31";
    kernels["broadcast_s"] = probe["broadcast_s"];
    src["measured_kernels.broadcast_s"] =
        script + " on " + std::to_string(ranks) + " Gloo ranks: 32 dist.broadcast(async_op=True) of 64 fp32 " +
        "as ZeroRedundancyOptimizer's _sync_params issues them (each rank's share from it, then every handle " +
        "waited for), a broadcast, median of 31 rounds";
    say(note, "calibrate: a broadcast from Python (ZeroRedundancyOptimizer's) %.1f us\n",
        probe["broadcast_s"].get<double>() * 1e6);
    for (const auto& [step, kinds] : probe["adamw_steps"].items())
      for (const auto& [kind, line] : kinds.items())
        say(note, "calibrate: AdamW %s over %ss %.1f us + %.1f us a tensor + %.1f us a shape\n", step.c_str(),
            kind.c_str(), line["fixed_s"].get<double>() * 1e6, line["per_tensor_s"].get<double>() * 1e6,
            line["per_shape_s"].get<double>() * 1e6);
    for (const char* version : {"1", "2"})
      for (const auto& [sharding, phases] : probe[std::string("fsdp") + version + "_hooks"].items())
        for (const auto& [phase, line] : phases.items())
          say(note, "calibrate: FSDP%s %s %s %.2f ms + %.2f ms a group + %.3f ms a parameter\n", version,
              sharding.c_str(), phase.c_str(), line["fixed_s"].get<double>() * 1e3,
              line["per_group_s"].get<double>() * 1e3, line["per_param_s"].get<double>() * 1e3);
    for (const auto& [mode, phases] : probe["ddp_hooks"].items())
      for (const auto& [phase, line] : phases.items())
        say(note, "calibrate: DDP (%s) %s %.2f ms + %.2f ms a bucket + %.3f ms a parameter\n", mode.c_str(),
            phase.c_str(), line["fixed_s"].get<double>() * 1e3, line["per_bucket_s"].get<double>() * 1e3,
            line["per_param_s"].get<double>() * 1e3);
    say(note, "calibrate: DDP's buffer broadcast %.1f us a forward\n", probe["ddp_buffers_s"].get<double>() * 1e6);
    // What this PyTorch could not run is left out of the profile: its plan
    // falls back to one dispatch per op there.
    for (const auto& reason : probe.value("not_measured", nlohmann::json::array()))
      say(note, "calibrate: not measured (a plan charges one dispatch per op instead): %s\n",
          reason.get<std::string>().c_str());
  }
  const std::pair<const char*, torch::Dtype> dtypes[] = {
      {"fp32", torch::kFloat}, {"bf16", torch::kBFloat16}, {"fp16", torch::kHalf}};
  for (const auto& [key, dtype] : dtypes) {
    Rate r;
    try {
      r = matmul_rate(dtype);
    } catch (const c10::Error& e) {  // LibTorch 1.13 has no fp16 matmul on the CPU
      src[std::string("peak_flops_per_s.") + key] =
          "not measurable here (" + std::string(e.what_without_backtrace()).substr(0, 80) + "), " +
          base.name +
          "'s figure kept: " + src[std::string("peak_flops_per_s.") + key].get<std::string>();
      say(note, "calibrate: %s matmul not measurable: %s; %s's figure kept\n", key,
          e.what_without_backtrace(), base.name.c_str());
      continue;
    }
    p["peak_flops_per_s"][key] = r.per_s;
    src[std::string("peak_flops_per_s.") + key] = where + r.detail;
    say(note, "calibrate: %s matmul %.1f GFLOP/s (%s)\n", key, r.per_s / 1e9, r.detail.c_str());
    const std::vector<double> grid = matmul_grid_rates(dtype);
    kernels["matmul_flops_per_s"][key] = grid;
    src[std::string("measured_kernels.matmul_flops_per_s.") + key] =
        where + "torch::mm_out on every matmul_dims cube point, median of >= 1 ms samples";
    say(note, "calibrate: %s matmul grid %.1f (16^3) to %.1f (1024^3) GFLOP/s\n", key,
        grid.front() / 1e9, grid.back() / 1e9);
    for (const auto& [op, rate] : kernel_rates(dtype)) {
      kernels["kernel_bytes_per_s"][key][op] = rate;
      src[std::string("measured_kernels.kernel_bytes_per_s.") + key + "." + op] =
          where + op + " on 1024 x 1024 " + key +
          ", bytes as the trace counts them (inputs and outputs), median of >= 1 ms samples";
      say(note, "calibrate: %s %s %.2f GB/s\n", key, op.c_str(), rate / 1e9);
    }
  }
  kernels["matmul_dims"] = kGemmDims;
  src["measured_kernels.matmul_dims"] =
      "the sizes of the grid calibrate measures (m, n and k each), chosen to span a step's "
      "products "
      "from attention heads to hidden sizes; beyond 1024 the rate is taken as 1024's";
  kernels["op_overhead_s"] = op_overhead_seconds();
  src["measured_kernels.op_overhead_s"] =
      where +
      "a chain of 200 y = y * c on 64 fp32 elements under autograd and its backward, "
      "over the 600 ops the recorder counts for it, median of >= 1 ms samples";
  say(note, "calibrate: op overhead %.2f us\n", kernels["op_overhead_s"].get<double>() * 1e6);
  p["measured_kernels"] = kernels;
  const Rate mem = memory_rate();
  for (const char* key : {"memory_bytes_per_s", "host_memory_bytes_per_s"}) {
    p[key] = mem.per_s;
    src[key] = where + mem.detail;
  }
  p["host_link"]["bytes_per_s"] = mem.per_s;
  src["host_link.bytes_per_s"] = where + mem.detail + " (host and device are the same memory)";
  say(note, "calibrate: memory %.2f GB/s (%s)\n", mem.per_s / 1e9, mem.detail.c_str());
  const int ranks = std::max(2, req.nproc);
  const int link_threads = std::max(1, static_cast<int>(cores) / ranks);
  const double latency = all_reduce_seconds(ranks, link_threads, 1);
  const Rate link = all_reduce_rate(ranks, link_threads, latency);
  p["gpu_link"]["bytes_per_s"] = link.per_s;
  src["gpu_link.bytes_per_s"] =
      where + link.detail + ", bytes as the time model counts a ring all-reduce";
  p["gpu_link"]["latency_s"] = latency;
  src["gpu_link.latency_s"] = where + "gloo all-reduce of one fp32 among " + std::to_string(ranks) +
                              " ranks over loopback TCP, median";
  say(note, "calibrate: gloo latency %.1f us\n", latency * 1e6);
  p["efficiency"]["collective"] = 1.0;
  src["efficiency.collective"] =
      "1: gpu_link.bytes_per_s is the rate gloo achieved, measured as above";
  say(note, "calibrate: gloo all-reduce %.2f GB/s per rank (%s)\n", link.per_s / 1e9,
      link.detail.c_str());
  p["name"] = req.name;
  p["description"] = "CPU ranks on " + m.cpu_model + ", calibrated by shardfit calibrate on " +
                     today() + " from " + base.name +
                     " (matmul, memory and gloo rates measured; efficiencies as " + base.name + ")";
  return p;
}

}  // namespace shardfit::launch
