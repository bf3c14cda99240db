// The module table (spec/module_table.h) of a LibTorch model: the one place
// that walks a torch module for it. The tracer reads it from the model it
// traces, the engine from the model it trains, the planner and the CLI from
// a model built on the meta device; so all of them index modules alike.
#pragma once

#include <vector>

#include "models/model.h"
#include "spec/module_table.h"

namespace shardfit::models {

// named_modules() order (pre-order, children in registration order), each
// module with the parameters it registered itself.
std::vector<spec::ModuleNode> module_table(TrainableModel& model);
// The table of `config`'s model, built on the meta device (no memory, no
// forward).
std::vector<spec::ModuleNode> module_table(const ModelConfig& config);

}  // namespace shardfit::models
