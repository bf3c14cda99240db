// The step time of `plan --stack pytorch`'s candidates: which tensors each
// of PyTorch's strategies reduces, gathers and steps, and how it overlaps
// them, handed to the time model (planner/time_model.h). Defined in
// pytorch_step_time.cc; the memory side is pytorch_plan.cc's.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/adamw_steps.h"
#include "planner/batch_search.h"
#include "planner/plan_builder.h"
#include "planner/time_model.h"
#include "planner/trace_file.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

// FSDP's candidates: zero2 and zero3; FSDP1's NO_SHARD, ddp with an auto
// wrap policy (ddp/.../wrap=none is DistributedDataParallel); with FSDP2
// also hybrid (HSDP).
bool is_fsdp(const Candidate& c);

// The FSDP candidate's units: FSDP1's auto wrap policy (a tied weight
// copied into each unit holding a registration of it), or FSDP2's
// fully_shard on each block and the root (a parameter in one group only).
spec::UnitPartition fsdp_units(const std::vector<ModuleNode>& modules, const Candidate& c, int version);

// What AdamW's step over tensors of `shapes` (one a tensor it steps) costs
// to dispatch, as the profile measured it (MeasuredKernels::adamw_steps:
// FSDP2's parameters are DTensors, whose propagation misses its cache once
// a step for each distinct shape), or 0 when it did not.
double adamw_dispatch_s(const DeviceProfile& profile, AdamwStep adamw, bool dtensors,
                        const std::vector<std::vector<int64_t>>& shapes);

// One step of candidate `c` over `world` ranks at `batch` sequences per
// rank, its FLOPs and ops from `trace`, its optimizer `adamw`.
StepTime pytorch_step_time(const Candidate& c, const PlanRequest& r, const TraceFile& file, int world,
                           const AffineTrace& trace, int64_t batch, AdamwStep adamw);

}  // namespace shardfit::planner
