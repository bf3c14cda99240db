// `shardfit run`: execute a candidate for real and measure it.
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/validators.h"
#include "executor/trainer.h"
#include "models/model_config.h"
#include "planner/profile.h"
#include "reports/run_report.h"

namespace shardfit::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string strategy = "ddp/fp32/wrap=none";
  int64_t batch = 1;
  int64_t seq_len = 0;  // 0: min(128, the model's positions)
  int64_t steps = 10;
  uint64_t seed = 1234;
  std::string data = "synthetic";
  std::string device = "cpu";
  std::string out;
  std::string gpu_mem;
  double lr = executor::AdamWOptions{}.lr;
  double weight_decay = executor::AdamWOptions{}.weight_decay;
  std::string command_line;
};

std::string now_iso8601() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

int run(const RunArgs& a) {
  models::ModelConfig cfg = models::resolve_model(a.model);
  if (a.device != "cpu")
    throw BadInput("--device " + a.device + ": this build runs on cpu only (no CUDA LibTorch)");
  if (a.strategy != "ddp/fp32/wrap=none")
    throw BadInput("--strategy " + a.strategy +
                   ": one-rank runs train ddp/fp32/wrap=none; sharded strategies need the "
                   "multi-rank executor, which this build does not have yet");
  executor::TrainOptions o;
  o.model = cfg;
  o.batch = a.batch;
  o.seq_len = a.seq_len > 0 ? a.seq_len : std::min<int64_t>(128, cfg.max_positions);
  o.steps = a.steps;
  o.seed = a.seed;
  o.data = a.data;
  o.adamw.lr = a.lr;
  o.adamw.weight_decay = a.weight_decay;
  if (!a.gpu_mem.empty()) {
    try {
      o.budget_bytes = planner::parse_size_bytes(a.gpu_mem);
    } catch (const std::invalid_argument& e) {
      throw BadInput(std::string("--gpu-mem: ") + e.what());
    }
  }

  const int64_t log_every = std::max<int64_t>(1, a.steps / 20);
  auto result = executor::train_single_rank(o, [&](const executor::StepLog& s) {
    if (s.step % log_every == 0 || s.step == s.steps || s.step == 1)
      spdlog::info("step {}/{}  loss {:.4f}  {:.0f} tokens/s  {:.1f} s", s.step, s.steps, s.loss,
                   s.tokens_per_s, s.elapsed_s);
  });

  reports::RunReport r;
  r.candidate = a.strategy;
  r.model = {{"name", cfg.name}, {"params", result.param_count}, {"seq_len", o.seq_len}};
  r.hardware = {{"profile", "cpu"},
                {"device_mem_bytes", o.budget_bytes > 0 ? nlohmann::json(o.budget_bytes) : nlohmann::json(nullptr)}};
  r.batch_per_gpu = o.batch;
  r.world_size = 1;
  r.backend = "none";
  r.device = "cpu";
  r.steps = static_cast<int64_t>(result.loss.size());
  r.loss = result.loss;
  r.tokens_per_s = result.tokens_per_s;
  reports::RankReport rank;
  rank.rank = 0;
  rank.measured.peak_allocated_bytes = rank.measured.peak_reserved_bytes = result.peak_allocated_bytes;
  for (const auto& t : result.timeline)
    rank.measured.timeline.push_back({t.phase, t.allocated_bytes, t.allocated_bytes, t.peak_allocated_bytes});
  rank.oom = result.oom;
  rank.oom_message = result.oom_message;
  r.ranks.push_back(rank);
  r.command = a.command_line;
  r.created = now_iso8601();

  std::printf("%s  %s  batch %lld x seq %lld  steps %zu\n", cfg.name.c_str(), a.strategy.c_str(),
              static_cast<long long>(o.batch), static_cast<long long>(o.seq_len), result.loss.size());
  if (!result.loss.empty())
    std::printf("loss %.4f -> %.4f   %.0f tokens/s   peak allocated %.2f MiB\n", result.loss.front(),
                result.loss.back(), result.tokens_per_s, result.peak_allocated_bytes / 1048576.0);
  if (result.oom) std::printf("out of memory: %s\n", result.oom_message.c_str());
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    if (!f) throw BadInput("--out " + a.out + ": cannot write file");
    f << reports::to_json(r).dump(2) << "\n";
  }
  return kExitOk;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Train a candidate for real on this machine and measure its memory");
  auto a = std::make_shared<RunArgs>();
  sub->add_option("--model", a->model, "Built-in model name or a Hugging Face config.json")->required();
  sub->add_option("--strategy", a->strategy, "Candidate id (one rank: ddp/fp32/wrap=none)")->capture_default_str();
  sub->add_option("--batch", a->batch, "Sequences per step")->capture_default_str()->check(AtLeastOne);
  sub->add_option("--seq-len", a->seq_len, "Tokens per sequence (default: min(128, model positions))")
      ->check(AtLeastOne);
  sub->add_option("--steps", a->steps, "Training steps")->capture_default_str()->check(AtLeastOne);
  sub->add_option("--seed", a->seed, "Seed for init, dropout and synthetic data")->capture_default_str();
  sub->add_option("--data", a->data, "'synthetic' or an llm.c uint16 token file (GPT-2)")->capture_default_str();
  sub->add_option("--device", a->device, "Where to run: cpu")->capture_default_str();
  sub->add_option("--lr", a->lr, "AdamW learning rate")->capture_default_str()->check(Positive);
  sub->add_option("--weight-decay", a->weight_decay, "AdamW decoupled weight decay")->capture_default_str()
      ->check(NonNegative);
  sub->add_option("--gpu-mem", a->gpu_mem,
                  "Cap the rank's device memory (24GiB, 512MiB, bytes); past it the step is an OOM");
  sub->add_option("--out", a->out, "Write the report JSON here");
  return {sub, [a] {
            a->command_line = command_line();
            return run(*a);
          }};
}

}  // namespace shardfit::cli
