// The data-parallel engine: trains one candidate (ddp, zero1, zero2, zero3,
// hybrid; +offload, +ckpt; fp32 or bf16/fp16 mixed precision) on this rank
// of a Communicator, with the meter recording what every phase used.
//
// The model stays single-device (models/ knows nothing of sharding); the
// engine applies parallelism from outside, as torchtitan does:
//  1. wrap: spec::wrap_modules over the model's module table
//     (models::module_table) gives the units; each becomes a FlatParam
//     (flat_param.h) laid out by spec::FlatParamLayout over its shard group —
//     the very description the planner simulates. What the candidate means
//     (what is sharded, when units reshard, where the master lives) is
//     spec::StrategyTraits, decoded once; the modules that recompute are
//     spec::recompute_modules, the tracer's own choice;
//  2. hooks: a ModuleRunner (the same seam the planner's tracer uses) sees
//     every module's forward begin and end, and puts identity autograd nodes
//     on its inputs and output, so a unit's backward begin (its output's
//     gradient is ready) and end (its inputs' gradients are) are seen too;
//  3. the order of events per strategy is planner/step_simulator.h's, which
//     is this engine's specification: pre-forward unshard, post-forward
//     reshard (zero3/hybrid, not the root unit), pre-backward unshard +
//     prefetch of the next unit in backward order + unsharded grad,
//     post-backward reduce-scatter (or all-reduce) and reshard, then AdamW
//     on shards. Units whose inputs need no gradient (embeddings, the root)
//     end their backward with the whole backward, as the tracer closes them.
//
// Engine states (FSDP2's TrainingState): FORWARD (running forward_loss),
// PRE_BACKWARD/POST_BACKWARD per unit inside loss.backward(), IDLE between
// (zero_grad, the optimizer). Meter marks carry the simulator's labels:
// "init", "step<k>/forward/<unit>", "step<k>/backward/<unit>",
// "step<k>/optimizer" (with gradient accumulation, each micro-batch marks its
// forward and backward labels again).
//
// Devices (EngineOptions::device): the same engine on the CPU (the tracking
// allocator meters it) or on a GPU (a CUDA LibTorch; the caching
// allocator's statistics meter it, meter.h's DeviceMeter), with nccl or
// loopback ranks. The CUDA path has run on one card (an H200, LibTorch
// 2.11, 2026-11-30): reports/gpu/README.md says what it measured.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/adamw.h"
#include "executor/comm.h"
#include "executor/engine_comm.h"  // all_reduce_host: the CLI gathers report text with it
#include "executor/flat_param.h"
#include "executor/meter.h"
#include "executor/train_checkpoint.h"
#include "executor/trainer.h"
#include "models/model_config.h"
#include "spec/candidate.h"
#include "spec/schedule.h"

namespace shardfit::executor {

// The single-rank trainer's options (the job: seq_len, steps, grad_accum,
// schedule; then model, batch, seed, data, adamw, budget_bytes), read per
// rank: `batch` is sequences per rank per micro-batch, `steps` optimizer
// steps, the seed's model init identical on every rank; then what only the
// engine has. The schedule here: --prefetch N (N in backward, N - 1 in
// forward), --async-reduce (FSDP2's one reduce-scatter in flight, DDP's
// reductions waited for at backward's end; off: each unit's completes at
// its post-backward), --async-gather (prefetched all-gathers beside compute).
struct EngineOptions : TrainOptions {
  spec::Candidate candidate;
  // Clip the global gradient norm (over every rank's shard) to this value,
  // as torch.nn.utils.clip_grad_norm_. 0 = off, the default: the single-rank
  // trainer does not clip, and the parity tests compare against it.
  double clip_grad_norm = 0;
  // hybrid: ranks per (emulated) node, the shard group; 0 = the whole world.
  int shard_group_size = 0;
  // Where the rank trains: cpu, or cuda:i (one GPU per rank; `cuda` alone
  // is cuda:0) in a build with a CUDA LibTorch. Parameters, gradients,
  // activations and comm buffers live there; +offload state on the host
  // (pinned on CUDA). The full model is built on the host first (as FSDP
  // does from a CPU init): the same initial values as on the CPU, and the
  // full model's bytes never pass through the GPU's caching allocator
  // (with init_from: on the meta device, each rank reading its part).
  c10::Device device = torch::kCPU;
  // budget_bytes (--gpu-mem; 0 = unlimited), past which the step fails as
  // OOM, a result: cpu, tracked bytes above what predates the run; cuda, a
  // card of this many bytes in all (DeviceMeter::limit_device_bytes).
  // Called at the start of every step (from 1); tests kill ranks here.
  std::function<void(int64_t step)> on_step_begin;
  // Sharded checkpoints (executor/train_checkpoint.h): resume after init,
  // save after the steps it names. A resumed run starts at the saved step
  // + 1 and runs to `steps`.
  CheckpointOptions checkpoint;
  // false (the default): a step whose loss (the mean over ranks) is NaN or
  // infinite ends the run there (EngineResult::diverged_at_step), on every
  // rank alike; true: train on (--allow-nonfinite).
  bool allow_nonfinite = false;
  // --save-on-signal (with checkpoint.save_dir): this rank's stop request,
  // polled after every step but the last (signals.h: the signal, 0 = none).
  // The ranks agree on it (agree_on_stop_signal), so a signal that reached
  // one rank stops them all after the same step: each saves that step's
  // committed checkpoint, as --save-every would, and the run ends
  // (EngineResult::stop_signal). Unset: no collective is added.
  std::function<int()> stop_requested;
  // `run --init`: a Hugging Face checkpoint (executor/hf_init.h); each rank
  // reads only the parameter elements it keeps; "" = Hugging Face init.
  std::string init_from;
  // `run --allocator-history` (CUDA): rank 0 records its caching allocator's
  // every alloc and free from before init to the end of the run (an
  // out-of-memory included) and writes them here; "" = no history.
  std::string allocator_history;
  // Test hooks: after init and after each optimizer step. Units are in
  // spec::wrap_modules order; each holds this rank's fp32 master and
  // AdamW state.
  std::function<void(const std::vector<FlatParam*>& units)> on_init;
  std::function<void(int64_t step, const std::vector<FlatParam*>& units)> on_step_end;
};

struct EngineResult {
  int64_t first_step = 1;    // > 1 when resumed from a checkpoint
  std::vector<double> loss;  // per completed step from first_step: mean over every rank's micro-batches
  double tokens_per_s = 0;   // whole job, after the first (warm-up) step when there are >= 2
  int64_t peak_allocated_bytes = 0;     // this rank, above what predates the run
  // What decides OOM on CUDA: the caching allocator's reserved peak (cpu:
  // equal to peak_allocated_bytes, nothing is cached).
  int64_t peak_reserved_bytes = 0;
  int64_t alloc_retries = 0;            // cuda: cudaMalloc retries after a cache flush; cpu: 0
  // cuda: free bytes in segments that predate the run (reserved minus
  // allocated at its start, after the cache is flushed: the slack beside
  // storages the process still holds, e.g. an earlier run's cuBLAS
  // workspaces). New small blocks can fill it without reserving, so the
  // run's reserved (above its start) may trail its allocated by up to this.
  int64_t cached_free_at_start_bytes = 0;
  std::vector<TimelinePoint> timeline;  // at the simulator's labels, reserved filled in
  std::string device = "cpu";           // "cpu" or "cuda"
  int64_t param_count = 0;
  int units = 0;
  // ddp/zero1: DDP's gradient buckets, bytes each, in the order backward
  // fills them (spec/grad_buckets.h); empty for zero2/3/hybrid.
  std::vector<int64_t> ddp_bucket_bytes;
  // `run --init`: the checkpoint's data bytes this rank read, of all its
  // parameters' stored bytes; -1 without --init.
  int64_t init_read_bytes = -1;
  int64_t init_data_bytes = -1;
  int64_t skipped_steps = 0;  // fp16: optimizer steps skipped on gradient overflow
  double loss_scale = 0;      // fp16: the dynamic loss scale at the end; 0 otherwise
  bool oom = false;           // the budget was hit; `loss` holds the steps before it
  std::string oom_message;
  std::vector<std::string> saved;  // checkpoint directories committed, in order
  int64_t diverged_at_step = 0;    // > 0: that step's loss was not finite; the run stopped there
  // --save-on-signal: the signal the ranks agreed to stop on (0 = none), and
  // the step they finished and saved (saved.back()) before stopping.
  int stop_signal = 0;
  int64_t saved_on_signal_step = 0;
};

// Trains on `world` (rank r of N reads global sequences r*b.. of each step,
// so N ranks of batch b train on what one rank of batch N*b does). Every
// rank must call it with the same options. Throws std::invalid_argument for
// bad options (batch 0, a shard group that does not divide the world,
// ddp+offload, a precision the CPU cannot compute, a device this build or
// machine cannot run on, gloo with CUDA ranks) and CommError when a peer
// fails.
EngineResult train_data_parallel(const EngineOptions& options, Communicator& world,
                                 const std::function<void(const StepLog&)>& on_step = {});

// The checks train_data_parallel starts with, for a world of `world_size`,
// without a communicator: a launcher calls it before starting any rank, so
// bad options fail once, in one line.
void check_engine_options(const EngineOptions& options, int world_size);
// --save-on-signal needs --save DIR (the step it stops at is saved there):
// the rule check_engine_options applies, for a launcher to apply first,
// before the checkpoint options' own checks. Throws std::invalid_argument.
void check_save_on_signal(bool save_on_signal, bool has_save_dir);

// True when this build trains on CUDA (LibTorch with CUDA). The CUDA path
// has run on one card (an H200 with LibTorch 2.11, 2026-11-30:
// reports/gpu/README.md).
bool engine_supports_cuda();
// True when this build has the nccl backend (NCCL and the CUDA runtime were
// found at build time; cmake/ShardfitCuda.cmake).
bool engine_supports_nccl();
// Whether the fused attention kernels (`--attention flash`, and sdpa's
// flash, memory-efficient and cuDNN kernels) can run: a CUDA LibTorch 2.0 or
// later (models/attention.h).
bool engine_supports_fused_attention();


}  // namespace shardfit::executor
