// `shardfit plan` end to end: trace the model (twice per distinct precision
// and checkpointing set, at batch 1 and 2 — see batch_search.h), then for
// every candidate build its units, simulate whole steps through the device's
// allocator model to find the largest batch per GPU that fits, say what
// stops the next one, and estimate its step time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "models/model_config.h"
#include "planner/candidate.h"
#include "planner/plan_output.h"
#include "planner/profile.h"
#include "planner/pytorch_stack.h"
#include "planner/step_simulator.h"
#include "planner/time_model.h"
#include "planner/trace_file.h"
#include "spec/job.h"

namespace shardfit::planner {

// The intra-op threads `shardfit run` gives each of `world` CPU ranks on
// this host (the cores / the ranks, at least 1): what a CPU trace's bf16
// matmuls book oneDNN scratchpads for.
int cpu_rank_threads(int world);

// Traces one `shardfit plan` sweep's plans share (make_trace_cache).
struct TraceCache;
std::shared_ptr<TraceCache> make_trace_cache();

// Whose training step a plan predicts: shardfit's engine (`shardfit run`),
// or PyTorch's own stack (planner/pytorch_stack.h; a traced model).
enum class Stack : uint8_t { kShardfit, kPytorch };

// The job (spec::JobOptions: --seq-len, --steps, --grad-accum and the
// schedule's options) and what only a plan is asked.
struct PlanRequest : spec::JobOptions {
  // A plan is of a job's steady state: --stack pytorch reads `steps` (2 or
  // more: step 2 on repeats; 1: a one-step job, no optimizer state during
  // its forward); shardfit's engine's plans do not.
  PlanRequest() { steps = 2; }
  Stack stack = Stack::kShardfit;
  // --stack pytorch: DDP(gradient_as_bucket_view=True) (default False, as PyTorch's).
  bool ddp_bucket_view = false;
  // --stack pytorch: DDP(static_graph=True) (default False).
  bool ddp_static_graph = false;
  // --stack pytorch, one GPU: the ddp candidates' model runs unwrapped, as
  // Accelerate and the Hugging Face Trainer leave a one-process job
  // (`--single-gpu-unwrapped`; PytorchDdpOptions::wrapped).
  bool single_gpu_unwrapped = false;
  // --stack pytorch: opt.zero_grad(set_to_none=...): true drops the
  // gradients (PyTorch 2.x's default; `--zero-grad none`), false zeroes them
  // in place (PyTorch 1.x's default; `--zero-grad zero`).
  bool zero_grad_set_to_none = true;
  // --stack pytorch: the loop keeps the forward's whole return until the
  // next forward (`--loop-keeps outputs`, the default) or the loss alone
  // (`--loop-keeps loss`).
  bool loop_keeps_outputs = true;
  // --stack pytorch: +ckpt candidates under torch.utils.checkpoint with
  // use_reentrant=True (`--checkpoint reentrant`, 1.13's default) instead of
  // False (`--checkpoint non-reentrant`, the default here).
  bool ckpt_reentrant = false;
  // --stack pytorch: the PyTorch the job runs (`--torch`, kPinnedTorch or "1.13").
  std::string torch = kPinnedTorch;
  // --stack pytorch, FSDP candidates: BackwardPrefetch (`--fsdp-backward-prefetch`).
  FsdpBackwardPrefetch fsdp_backward_prefetch = FsdpBackwardPrefetch::kBackwardPre;
  // --stack pytorch, FSDP candidates: 1 (FullyShardedDataParallel as 1.13
  // has it, planner/pytorch_fsdp.h) or 2 (fully_shard, planner/pytorch_fsdp2.h)
  // (`--fsdp-version`).
  int fsdp_version = 1;
  // --stack pytorch, FSDP candidates: MixedPrecision(reduce_dtype=...)
  // (FSDP1) or MixedPrecisionPolicy(reduce_dtype=...) (FSDP2)
  // (`--fsdp-reduce-dtype`): "param" (the gradients reduced in the dtype
  // they are computed in: param_dtype's, fp32 without mixed precision),
  // "fp32", "bf16" or "fp16" (parse_fsdp_reduce_dtype).
  std::string fsdp_reduce_dtype = "param";
  // --stack pytorch: torch.optim.AdamW's step (`--adamw-step`): the
  // for-loop one, the multi-tensor one (foreach=True) or the fused one
  // (fused=True), the last two for zero1 and FSDP composed over the
  // partition or the shards (planner/adamw_steps.h); unset, what the job's
  // PyTorch picks for each candidate when the script passes neither
  // (adamw_foreach_default in pytorch_stack.h).
  std::optional<AdamwStep> adamw_step;
  // --stack pytorch, FSDP1 bf16 candidates: MixedPrecision(
  // keep_low_precision_grads=True) (`--fsdp-keep-low-precision-grads`).
  bool fsdp_keep_low_precision_grads = false;
  // --stack pytorch, FSDP1 candidates: FullyShardedDataParallel(
  // use_orig_params=True) (`--fsdp-use-orig-params`): AdamW over each
  // original parameter's part of the rank's shard, not the FlatParameters.
  bool fsdp_use_orig_params = false;
  models::ModelConfig model;
  // --trace: plan this file's traces (a model traced in its own process,
  // e.g. one written in Python) instead of tracing `model`, which is then
  // unused. Its sequence length is the plan's; candidates whose precision or
  // recomputed modules the file has no trace for are not swept.
  std::shared_ptr<const TraceFile> trace_file;
  // A sweep's plans of one model (shardfit's stack, traced here) share their
  // traces through this when set: those depend on the sequence length, the
  // kernels and a CPU rank's threads, not on the world or the memory. A
  // cache serves one model and one device profile.
  std::shared_ptr<TraceCache> trace_cache;
  int gpus_per_node = 1;
  int nodes = 1;
  DeviceProfile profile;
  int64_t device_mem_bytes = 0;  // 0: the profile's memory (CPU: unlimited)
  // Whether the job opens an NCCL communicator (world > 1 on CUDA, backend
  // nccl), whose buffers the profile charges outside the allocator; false
  // for `shardfit run --backend loopback`, which has no peer to talk to.
  bool nccl_communicator = true;
  CandidateOptions candidates;   // strategies/precisions filters; the rest is filled in
  Optimizer optimizer = Optimizer::kAdamW;
  Objective objective = Objective::kThroughput;
  int64_t max_batch = 4096;      // search cap (only reached without a memory limit)
  // grad_accum (JobOptions): the batch searched for is the micro-batch.
  // zero2/3/hybrid then hold their fp32 shard grads through every
  // micro-batch after the first, so their max batch can only shrink. The
  // schedule's --ddp-bucket-cap-mb is --stack pytorch's DDP's too.
  // Called as the plan advances, from build_plan's worker threads but never
  // two at once: stage "trace" (one traced step of a distinct precision and
  // recompute set) or "simulate" (one candidate's batch search done), how
  // many of that stage are done out of how many, and what was just done.
  std::function<void(const std::string& stage, size_t done, size_t total, const std::string& label)>
      on_progress;
};

// Throws std::invalid_argument (one line) for impossible requests: zero
// GPUs, a job spec::check_job_options refuses, a sequence the model cannot
// take, memory smaller than the fixed overheads, filters that leave no
// candidate.
Plan build_plan(const PlanRequest& request);

// Internal to build_plan: `--stack pytorch` (planner/pytorch_plan.cc), with
// the allocator budget and the device's memory build_plan worked out, and the
// simulator's per-class bytes as a plan's breakdown.
Plan build_pytorch_plan(const PlanRequest& request, int64_t budget_bytes, int64_t device_mem_bytes);
MemoryBreakdown to_breakdown(const CategoryBytes& bytes);
// What build_plan and build_pytorch_plan share:
// the plan's header: the model (the trace file's when given), the hardware
// and the job, no candidates yet;
Plan plan_skeleton(const PlanRequest& r, const TraceFile* file, int64_t device_mem, int64_t budget);
// a candidate's predicted peaks and breakdown, from the simulation of the
// batch it fits;
void set_fit(PlanCandidate& pc, const StepSimResult& fit);
// a candidate whose search reached `max_batch`: its limit says so (true);
// false when memory stopped it (then set_limit).
bool set_search_capped(PlanCandidate& pc, int64_t max_batch);
// A candidate's `limit` and `oom` from the simulation of `batch`, its first
// batch that does not fit.
void set_limit(PlanCandidate& pc, const StepSimResult& stop, int64_t batch);
// A candidate's predicted step time and its parts, from the time model.
void set_step_time(PlanCandidate& pc, const StepTime& st);

// One candidate at one (micro-)batch, simulated with its timeline: what
// `run` reports beside its measurements. `request.candidates` is ignored.
struct CandidatePrediction {
  StepSimResult sim;        // peaks, breakdown, timeline (labels match the executor's marks)
  double step_time_s = 0;   // 0 when the batch does not fit
  double tokens_per_s = 0;
  int units = 0;
};
// `steps` (1 or 2): how many training steps after init the simulation
// replays, so a one-step run is predicted for the one step it runs.
CandidatePrediction predict_candidate(const PlanRequest& request, const Candidate& candidate,
                                      int64_t batch, int steps = 2);

}  // namespace shardfit::planner
