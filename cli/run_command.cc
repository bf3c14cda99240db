// `shardfit run`: its options, the job they describe (launch::RunRequest),
// and what it prints; the run layer (launch/run.h) runs the job: launching
// ranks, resolving the job, collecting every rank's outcome.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/validators.h"
#include "launch/run.h"

namespace shardfit::cli {
namespace {

// The summary of a run's report on stdout (the report itself goes to --out).
void print_report(const reports::RunReport& r, const launch::Job& job) {
  std::printf("%s  %s  %d rank(s) x batch %lld x seq %lld  steps %zu\n", job.model.name.c_str(), r.candidate.c_str(),
              r.world_size, static_cast<long long>(r.batch_per_gpu), static_cast<long long>(job.seq_len),
              r.loss.size());
  if (!r.loss.empty())
    std::printf("loss %.4f -> %.4f   %.0f tokens/s\n", r.loss.front(), r.loss.back(), r.tokens_per_s);
  if (r.step_time_measured_s) {
    std::printf("step %.4f s", *r.step_time_measured_s);
    if (r.step_time_error_pct)
      std::printf(", predicted %.4f s (%+.1f%%) on %s", *r.step_time_predicted_s, *r.step_time_error_pct,
                  job.profile.c_str());
    std::printf("\n");
  }
  for (const auto& rk : r.ranks) {
    std::printf("rank %d: peak allocated %.3f MiB", rk.rank, rk.measured.peak_allocated_bytes / 1048576.0);
    if (rk.predicted)
      std::printf(", predicted %.3f MiB (%+.3f%%)", rk.predicted->peak_allocated_bytes / 1048576.0,
                  rk.peak_error_pct.value_or(0.0));
    if (rk.init_read_bytes)
      std::printf(", --init read %.3f of %.3f MiB", *rk.init_read_bytes / 1048576.0, r.init_data_bytes / 1048576.0);
    std::printf("%s\n", rk.oom ? "  OUT OF MEMORY" : "");
    if (rk.oom && rk.rank == r.ranks.front().rank) std::printf("out of memory: %s\n", rk.oom_message.c_str());
  }
  std::fflush(stdout);
}

// A step's progress line in the log: about 20 a run, and the first and last.
void log_step(const executor::StepLog& s) {
  const int64_t log_every = std::max<int64_t>(1, s.steps / 20);
  // The first of several steps is warm-up, not timed (its tokens/s is 0).
  if (s.step % log_every == 0 || s.step == s.steps || s.step == 1)
    spdlog::info("step {}/{}  loss {:.4f}  {}  {:.1f} s  {}", s.step, s.steps, s.loss,
                 s.tokens_per_s > 0 ? fmt::format("{:.0f} tokens/s", s.tokens_per_s) : std::string("warm-up, not timed"),
                 s.elapsed_s, eta_text(s.elapsed_s, static_cast<size_t>(s.step), static_cast<size_t>(s.steps)));
}

launch::RunPrinter printer() {
  return {log_step, print_report, [](const std::string& line) {
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
          }};
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Train a candidate for real on this machine and measure its memory");
  auto a = std::make_shared<launch::RunRequest>();
  sub->add_option("--model", a->model, "Built-in model name or a Hugging Face config.json")->check(Named);
  auto* strategy = sub->add_option("--strategy", a->strategy,
                                   "Candidate id: SHARDING[+offload][+ckpt]/PRECISION/wrap=POLICY")
                       ->capture_default_str();
  auto* batch = sub->add_option("--batch", a->batch, "Sequences per step per rank")->capture_default_str()->check(BatchBounds);
  auto* seq = sub->add_option("--seq-len", a->seq_len, "Tokens per sequence (default: min(128, model positions))")
                  ->check(SeqLenBounds);
  sub->add_option("--steps", a->steps, "Training steps")->capture_default_str()->check(StepsBounds);
  sub->add_option("--seed", a->seed, "Seed for init, dropout and synthetic data")->capture_default_str()->check(Seed);
  sub->add_option("--data", a->data, "'synthetic' or an llm.c uint16 token file (GPT-2)")->capture_default_str()->check(Named);
  sub->add_option("--device", a->device,
                  "Where to run: cpu, or cuda (one GPU per rank, cuda:LOCAL_RANK; needs a build against a CUDA "
                  "LibTorch, as `shardfit --version` says); measured on an H200 against its plan: "
                  "reports/gpu/README.md")
      ->capture_default_str();
  sub->add_option("--profile", a->profile,
                  std::string("Device profile the prediction beside the measurement is for (cpu runs: cpu; cuda "
                              "runs: default the plan's, else ") +
                      launch::kDefaultCudaProfile + ", the card --gpu-mem 24GiB emulates)")
      ->check(Named);
  sub->add_option("--lr", a->lr, "AdamW learning rate")->capture_default_str()->check(Positive);
  sub->add_option("--weight-decay", a->weight_decay, "AdamW decoupled weight decay")->capture_default_str()
      ->check(NonNegative);
  sub->add_option("--gpu-mem", a->gpu_mem,
                  "Cap each rank's device memory (24GiB, 512MiB, bytes); past it the step is an OOM (a result). "
                  "cuda: a card of that total (what the process holds outside the caching allocator counts)")
      ->check(MemorySize);
  sub->add_option("--out", a->out, "Write the report JSON here (rank 0 writes every rank's figures)")->check(Named);
  sub->add_option("--nproc", a->nproc,
                  "Spawn N local ranks, at most one per core unless --oversubscribe (else torchrun's RANK, "
                  "WORLD_SIZE, ... or one rank)")
      ->check(AtLeastOne);  // at most spec::kMaxLocalRanks: launch::check_local_ranks, also for a plan's world
  sub->add_flag("--oversubscribe", a->oversubscribe, "Allow --nproc above the cores of this machine");
  sub->add_option("--backend", a->backend,
                  "gloo (CPU ranks; the default on cpu), nccl (CUDA ranks; the default with --device cuda) or "
                  "loopback (one process rehearses rank --rank of --world-size)");
  sub->add_option("--rank", a->rank, "loopback: the rank this process stands in for (default 0)")
      ->check(IntRange(0, spec::kMaxWorld - 1));
  sub->add_option("--world-size", a->world_size, "loopback: the world it rehearses")->check(IntRange(1, spec::kMaxWorld));
  auto* gpus_per_node = sub->add_option("--gpus-per-node", a->gpus_per_node,
                  "hybrid: ranks per (emulated) node, the shard group (default: LOCAL_WORLD_SIZE or the world)")
      ->check(GpusPerNodeBounds);
  sub->add_option("--timeout", a->timeout_s, "Seconds a rank waits for its peers (rendezvous, each collective)")
      ->capture_default_str()
      ->check(Seconds);
  sub->add_option("--plan", a->plan, "Run a plan's chosen candidate at its max batch (plan JSON)")->check(Named);
  sub->add_option("--candidate", a->candidate, "With --plan: run this candidate instead of the chosen one")->check(Named);
  auto* grad_accum =
      sub->add_option("--grad-accum", a->grad_accum, "Micro-batches per optimizer step (default 1, or the plan's)")
          ->capture_default_str()
          ->check(GradAccumBounds);
  auto* prefetch = sub->add_option("--prefetch", a->prefetch,
                                   "Units gathered ahead (zero3/hybrid): N in backward, N - 1 in forward (default 1, "
                                   "or the plan's); gathers stay synchronous")
                       ->capture_default_str()
                       ->check(PrefetchBounds);
  sub->add_flag("--async-reduce", a->async_reduce,
                "Reduce gradients beside the rest of backward (default off, or the plan's): one reduce-scatter "
                "in flight as FSDP2 keeps, DDP's all-reduces waited for at backward's end");
  auto* bucket_cap = sub->add_option("--ddp-bucket-cap-mb", a->ddp_bucket_cap_mb,
                                     "ddp/zero1: DDP(bucket_cap_mb=...), the size gradient buckets close at, each "
                                     "all-reduced once autograd has its last gradient (the first at 1 MiB; "
                                     "default 25, or the plan's)")
                         ->type_name("MB")
                         ->capture_default_str();
  sub->add_flag("--async-gather", a->async_gather,
                "Run prefetched all-gathers beside compute (default off, or the plan's), waited for where the "
                "unit runs");
  sub->add_option("--clip-grad-norm", a->clip_grad_norm,
                  "Clip the global gradient norm (across shards) to this value; 0 = off")
      ->capture_default_str()
      ->check(NonNegative);
  sub->add_option("--save", a->save,
                  "Save sharded checkpoints under DIR (DIR/step-NNNNNN, one file per rank + manifest.json) "
                  "after the last step")
      ->type_name("DIR")->check(Named);
  sub->add_option("--save-every", a->save_every, "With --save: also save after every N-th step")
      ->check(AtLeastOne);
  sub->add_option("--resume", a->resume,
                  "Continue from a checkpoint (a step-NNNNNN directory, or a --save DIR: its latest); "
                  "--steps stays the total")
      ->type_name("DIR")->check(Named);
  sub->add_flag("--save-on-signal", a->save_on_signal,
                "With --save: on SIGTERM/SIGINT every rank finishes its step, all save it (DIR/step-NNNNNN, "
                "as --save-every does), the report says interrupted, and run exits 143/130; a second signal "
                "stops at once (the last committed checkpoint stays)");
  sub->add_option("--export", a->export_path,
                  "With --save: write the last checkpoint as one Hugging Face .safetensors file")
      ->type_name("FILE")->check(Named);
  sub->add_flag("--oom-ok", a->oom_ok,
                "Exit 0 when a rank goes out of memory (default: exit 4; the report is written either way)");
  sub->add_flag("--resume-anyway", a->resume_anyway,
                "With --resume: resume even though an option that changes the steps (batch, seq-len, "
                "grad-accum, seed, data, lr, ...) differs from the checkpoint's; the report lists them");
  sub->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "Train on when the loss turns NaN/Inf (default: stop, exit 1, \"diverged at step N\")");
  sub->add_option("--loss", a->loss, "full or chunked:N (N tokens at a time; llama family); default: the plan's");
  sub->add_option("--attention", a->attention,
                  "sdpa (the kernel PyTorch's scaled_dot_product_attention picks where the job runs: eager on "
                  "the CPU; on CUDA in fp16/bf16 cuDNN's at compute capability 9.0 and 10.0, flash elsewhere "
                  "from 8.0, else the memory-efficient kernel), eager or flash (a CUDA LibTorch 2.0+ build only); default: the plan's, else sdpa");
  sub->add_option("--init", a->init,
                  "Start from Hugging Face weights: a .safetensors file, or a directory with model.safetensors "
                  "or model.safetensors.index.json and its shards (F32/BF16/F16, converted to the fp32 master)")
      ->type_name("PATH")->check(Named);
  sub->add_option("--allocator-history", a->allocator_history,
                  "cuda: write rank 0's caching-allocator history here (every alloc and free of the run, with "
                  "address, size, stream and the phase it came after, as reports/gpu/history holds; LibTorch 2.11+)")
      ->type_name("FILE")
      ->check(Named);
  sub->add_flag("--reference-trainer", a->reference_trainer,
                "One rank, ddp/fp32/wrap=none, through the plain single-rank trainer instead of the engine "
                "(the parity reference)");
  return {sub, [a, batch, seq, strategy, grad_accum, prefetch, bucket_cap, gpus_per_node] {
            a->batch_given = batch->count() > 0;
            a->grad_accum_given = grad_accum->count() > 0;
            a->prefetch_given = prefetch->count() > 0;
            a->ddp_bucket_cap_given = bucket_cap->count() > 0;
            a->seq_len_given = seq->count() > 0;
            a->gpus_per_node_given = gpus_per_node->count() > 0;
            a->strategy_given = strategy->count() > 0;
            const char* parent = std::getenv("SHARDFIT_COMMAND_LINE");  // a rank of `--nproc`
            a->command_line = parent && std::getenv("RANK") ? parent : command_line();
            a->profiles_dir = profiles_dir();
            return launch::run(*a, printer());
          }};
}

}  // namespace shardfit::cli
