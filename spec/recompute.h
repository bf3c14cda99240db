// Which modules re-run their forward inside backward under a +ckpt candidate
// (activation checkpointing, called "recompute" in the code so that it is not
// confused with the save/resume checkpoints of executor/train_checkpoint.h).
// The tracer records the recomputation of exactly these modules and the
// engine wraps exactly these in models::checkpoint, so the planner and the
// executor recompute the same modules.
#pragma once

#include <vector>

#include "spec/module_table.h"
#include "spec/wrap_policy.h"

namespace shardfit::spec {

// Every unit's root module except the model root and units nested in
// another recomputed one; when the policy makes no unit but the root, the
// transformer blocks (checkpointing the root alone would save nothing).
// Returns module indices in table order.
std::vector<int> recompute_modules(const std::vector<ModuleNode>& modules, const UnitPartition& units);

}  // namespace shardfit::spec
