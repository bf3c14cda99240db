// What export-config's formats share (planner/launch_config.cc writes the
// JSON and YAML formats, planner/launch_python.cc the Python module): how a
// candidate's parts read in PyTorch's terms, as the plan simulated them.
// Private to those two files.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/launch_config.h"

namespace shardfit::planner::launch {

using ojson = nlohmann::ordered_json;

// A candidate's wrap= part: "none", "block" or "size" with its threshold.
struct WrapPolicyText {
  std::string kind;
  int64_t min_num_params = 0;
};

// "bfloat16", "float16", "float32": torch's dtype names.
const char* torch_dtype(DType d);
const char* torch_dtype(Precision p);

// The reduce_dtype the plan simulated: the plan's fsdp_reduce_dtype, or with
// none given ("param") the candidate's own dtype.
DType reduce_dtype(const Plan& plan, const Candidate& c);

bool planned_fsdp2(const Plan& plan);

// A --stack pytorch plan's ddp candidate with an auto wrap policy:
// FSDP1's NO_SHARD (planner/pytorch_stack.h fsdp_no_shard), not
// DistributedDataParallel.
bool planned_no_shard(const Plan& plan, const Candidate& c);

// DistributedDataParallel, with ZeroRedundancyOptimizer for zero1: the
// candidates no FSDP wraps.
bool planned_ddp(const Plan& plan, const Candidate& c);

// FSDP1's use_orig_params as the plan simulated it (false: FlatParameters).
bool planned_orig_params(const Plan& plan);

// FSDP1's BackwardPrefetch member as the plan simulated it ("BACKWARD_PRE",
// "BACKWARD_POST"), or null for none.
ojson backward_prefetch(const Plan& plan);

// The keyword the plan simulated torch.optim.AdamW with for the candidate:
// foreach=False, foreach=True or fused=True.
struct AdamwKeyword {
  std::string name;  // "foreach" or "fused"
  bool value = false;
  std::string python() const { return name + (value ? "=True" : "=False"); }
};
AdamwKeyword adamw_keyword(const Plan& plan, const PlanCandidate& pc);
// "the plan assumed torch.optim.AdamW(foreach=False)".
std::string adamw_assumed(const Plan& plan, const PlanCandidate& pc);

// +ckpt with wrap=none is refused by every format: one unit, the whole model.
void check_ckpt(const Candidate& c, LaunchFormat format);

// +offload under DistributedDataParallel (ddp, zero1): refused by the
// PyTorch formats, which have no offload for a replicated model.
void check_ddp_offload(const Candidate& c, LaunchFormat format);

// The job: candidate, model, seq len, batch per GPU, accumulation, world.
ojson batch_section(const Plan& plan, const PlanCandidate& pc);

// The checkpoint wrapper the plan simulated: "reentrant" or "non-reentrant".
bool checkpoint_reentrant(const Plan& plan);

// The Python module for `--format python` (planner/launch_python.cc).
LaunchConfig python_module(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                           const std::string& block_class);

}  // namespace shardfit::planner::launch
