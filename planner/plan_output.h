// The plan: what `shardfit plan` predicts for every candidate (max batch per
// GPU, peak memory and its breakdown at that batch, what stops one more, step
// time, tokens/s) and which candidate it chooses. This header holds the plan
// as structs, its JSON form (SPEC.md's "shardfit.plan/1", plus extra fields
// SPEC allows), the choice by objective, and the plain-text table the CLI
// prints. `validate` and `run --plan` read plans back through from_json,
// which checks the schema and every field and names the bad one in a
// one-line error.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "planner/candidate.h"
#include "spec/schedule.h"

namespace shardfit::planner {

inline constexpr const char kPlanSchema[] = "shardfit.plan/1";

// SPEC's memory classes, at the predicted peak (allocated bytes; overhead is
// what the device holds besides tensors: caching-allocator slack, workspaces).
struct MemoryBreakdown {
  int64_t params_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activations_bytes = 0;
  int64_t comm_buffers_bytes = 0;
  int64_t temporaries_bytes = 0;
  int64_t overhead_bytes = 0;
  int64_t total_bytes() const {
    return params_bytes + grads_bytes + optimizer_bytes + activations_bytes + comm_buffers_bytes +
           temporaries_bytes + overhead_bytes;
  }
};

// The prediction at a candidate's max batch (at batch 1 when nothing fits,
// so the user sees by how much).
struct Prediction {
  int64_t peak_reserved_bytes = 0;   // decides OOM under the caching allocator
  int64_t peak_allocated_bytes = 0;  // decides OOM under the exact allocator
  MemoryBreakdown breakdown;
  double step_time_s = 0;
  double tokens_per_s = 0;  // global
  // Extras (not in SPEC's minimum; absent in a plan reads as 0).
  int64_t peak_host_bytes = 0;  // host memory per rank (offload state)
  double compute_s = 0;         // time parts, see time_model.h
  double comm_s = 0;
  double exposed_comm_s = 0;
  double offload_s = 0;
  double optimizer_s = 0;
  // Each rank's peak where ranks differ (--stack pytorch zero1: each holds
  // its own partition's optimizer state); empty when every rank's is the same.
  std::vector<int64_t> rank_peak_allocated_bytes;
  // --stack pytorch: each rank's timeline at the max batch, the points
  // pytorch/validate.py marks ("init", "stepK/forward", "stepK/backward",
  // "stepK/optimizer"), one timeline when the ranks are alike; the JSON's
  // predicted.rank_timelines, each point {phase, allocated_bytes,
  // peak_allocated_bytes} as run's reports write them. Empty otherwise.
  struct Point {
    std::string phase;
    int64_t allocated_bytes = 0;
    int64_t peak_allocated_bytes = 0;
  };
  std::vector<std::vector<Point>> rank_timelines;
};

struct PlanCandidate {
  Candidate candidate;
  int64_t max_batch_per_gpu = 0;  // 0 = not even batch 1 fits
  Prediction predicted;
  // What stops max+1: the memory class and where in the step, e.g.
  // "activations in step2/backward/transformer.h.35".
  std::string limit;
  // extra: the allocation that fails batch max+1 (batch 1 when none fits),
  // as PyTorch's out-of-memory error reports it: "Tried to allocate
  // <allocation_bytes> (...; <allocated_bytes> already allocated; ...;
  // <reserved_bytes> reserved in total by PyTorch)". Absent when the search
  // reached its cap.
  struct Oom {
    int64_t batch = 0;
    std::string at;             // the phase, as in `limit`
    int64_t request_bytes = 0;  // the tensor's bytes
    int64_t allocation_bytes = 0;
    int64_t allocated_bytes = 0;
    int64_t reserved_bytes = 0;
  };
  std::optional<Oom> oom;
  int units = 0;  // extra: wrapped units (FSDP instances); 0 = unknown
  // extra, --stack pytorch: the AdamW step simulated for it, "for-loop"
  // (foreach=False), "foreach" (foreach=True) or "fused" (fused=True),
  // written as adamw_step and, for older readers, adamw_foreach; "" in
  // shardfit's plans (and in PyTorch-stack plans older than candidates'
  // adamw_foreach: pytorch_job's then).
  std::string adamw_step;
  // extra: the attention kernel it runs, "eager", "flash", "efficient" or "cudnn"
  // (--attention sdpa resolves per precision); "" for a traced model (its
  // forward's own) and in older plans (model.attention's then).
  std::string attention;
  std::string id() const { return candidate.to_id(); }
};

struct PlanModel {
  std::string name;
  int64_t params = 0;  // exact parameter count
  int64_t seq_len = 0;
  std::string loss = "full";  // extra: "full" or "chunked:N" (--loss), every candidate's
  std::string attention = "eager";  // extra: --attention: "sdpa" (each candidate's own), "eager" or "flash"
  // A model planned from --trace: its transformer block's class (the
  // module type the trace marks as a block), what export-config's wrap=block
  // names as transformer_layer_cls; "" for a built-in (models/ knows it).
  std::string block_class = "";
};

struct PlanHardware {
  std::string profile;
  int64_t device_mem_bytes = 0;  // the budget planned against (after --gpu-mem)
  int gpus_per_node = 1;
  int nodes = 1;
  // extra: what of it the allocator may hold, after the profile's fixed
  // overheads outside it (a CUDA context, NCCL's buffers); written when
  // smaller than device_mem_bytes (0 = the same, or unknown)
  int64_t allocator_budget_bytes = 0;
  int world_size() const { return gpus_per_node * nodes; }
};

enum class Objective : uint8_t {
  kThroughput,  // highest tokens/s among those that fit batch 1; ties: larger batch
  kBatch,       // largest max batch; ties: higher tokens/s
};
const char* objective_name(Objective objective);  // "throughput", "batch"
// Throws std::invalid_argument: "unknown objective 'x' (use throughput or batch)".
Objective parse_objective(const std::string& text);

struct Plan {
  // extra: whose step was predicted: "shardfit" (its engine) or "pytorch"
  // (PyTorch's DDP and optimizer, `plan --stack pytorch`; then
  // ddp_bucket_view says DDP's gradient_as_bucket_view). Absent = shardfit.
  std::string stack = "shardfit";
  bool ddp_bucket_view = false;
  bool ddp_static_graph = false;  // extra, --stack pytorch: DDP(static_graph=True); written when true
  // extra, --stack pytorch: a one-GPU job's ddp candidates run the model
  // unwrapped (--single-gpu-unwrapped); written when true
  bool single_gpu_unwrapped = false;
  // extra, --stack pytorch: the rest of the job the plan assumed, as plan's
  // options of the same names say it; written with stack "pytorch" (absent
  // in older plans: then not known).
  struct PytorchJob {
    std::string torch;                   // the PyTorch the job runs: "2.11" or "1.13"; absent in older plans = ""
    std::string zero_grad;               // "none" (set_to_none=True) or "zero"
    std::string checkpoint;              // the +ckpt candidates': "non-reentrant" or "reentrant"
    int64_t ddp_bucket_cap_bytes = 0;    // DDP(bucket_cap_mb=...) in bytes
    std::string fsdp_backward_prefetch;  // "pre", "post" or "none"
    int steps = 0;                       // training steps simulated (2: the steady state)
    int fsdp_version = 1;                // FSDP candidates: 1 (FullyShardedDataParallel) or 2 (fully_shard); absent in older plans = 1
    std::string fsdp_reduce_dtype = "param";  // FSDP's reduce_dtype: "param" (none given), "fp32", "bf16", "fp16"; absent = "param"
    // `--adamw-step` given for every candidate: "for-loop", "foreach" or
    // "fused"; "" when none was (each candidate's says which). Written as
    // adamw_step when given, and adamw_foreach (true for "foreach").
    std::string adamw_step{};
    // FSDP1's MixedPrecision(keep_low_precision_grads=True); absent = false
    bool fsdp_keep_low_precision_grads = false;
    // FSDP1's use_orig_params=True; absent = false (FlatParameters)
    bool fsdp_use_orig_params = false;
    // What the loop keeps until the next forward: "outputs" (the forward's
    // whole return) or "loss"; absent in older plans = "outputs"
    std::string loop_keeps = "outputs";
  };
  std::optional<PytorchJob> pytorch_job;
  PlanModel model;
  PlanHardware hardware;
  std::string optimizer = "adamw";               // extra
  int grad_accum = 1;  // extra: micro-batches per optimizer step; max batch is per micro-batch
  // extra: "prefetch" (units gathered ahead; absent in older plans = 1),
  // "async_reduce" and "async_gather" (written when true).
  spec::ScheduleOptions schedule;
  Objective objective = Objective::kThroughput;  // extra
  std::vector<PlanCandidate> candidates;
  std::string chosen;  // a candidate id; "" (JSON null) when nothing fits

  // nullptr when `id` (any spelling parse_candidate accepts) is not planned.
  const PlanCandidate* find(const std::string& id) const;
};

// The candidate a command takes from the plan read from `path` (run's and
// export-config's --candidate, validate's --candidates, each `option`): the
// one `id` names, or the chosen one when `id` is empty. Throws
// std::invalid_argument, one line, the same for every command: the plan
// chose none (nothing fits batch 1), or `id` is not among its candidates.
const PlanCandidate& candidate_to_use(const Plan& plan, const std::string& path, const std::string& option,
                                      const std::string& id);

// Whether `a` ranks above `b` under `objective`: throughput, the higher
// tokens/s, then the larger batch; batch, the other way round. On a full tie
// bf16 ranks above fp16 (the same bytes and speed, and no loss scaling; a
// profile without bf16 plans no bf16 candidate).
bool ranks_above(const PlanCandidate& a, const PlanCandidate& b, Objective objective);

// The index of the best candidate under `objective` (ranks_above), or
// nullopt when none fits batch 1. Other full ties keep the earlier candidate.
std::optional<size_t> choose(const std::vector<PlanCandidate>& candidates, Objective objective);

// JSON, found by nlohmann through ADL (`json j = plan; Plan p = j;`).
// from_json throws std::invalid_argument naming the field
// ("plan: field 'candidates[2].predicted.step_time_s' must be a number").
void to_json(nlohmann::json& j, const Plan& plan);
void from_json(const nlohmann::json& j, Plan& plan);
void to_json(nlohmann::json& j, const PlanCandidate& candidate);

// Text <-> Plan. `origin` (a file name) prefixes error messages.
std::string plan_to_json_text(const Plan& plan);  // pretty, trailing newline
Plan parse_plan(const std::string& json_text, const std::string& origin = "plan");
// Throw std::invalid_argument naming the path when it cannot be read/written.
Plan read_plan_file(const std::string& path);
void write_plan_file(const std::string& path, const Plan& plan);

}  // namespace shardfit::planner
