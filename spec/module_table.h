// The module table: a model's modules in named_modules() order (pre-order,
// children in registration order), each with the parameters it owns. It is
// what wrap policies cut into units and what the shard layout flattens; the
// tracer (planner/trace) and the engine (executor/engine) both read it from
// models::module_table(), the one LibTorch-side function that walks a torch
// module. Nothing here depends on LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardfit::spec {

struct ParamInfo {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

struct ModuleNode {
  std::string path;  // "" for the root, else e.g. "transformer.h.0.attn"
  std::string type;  // e.g. "GPT2Block"
  int parent = -1;   // index into the table, -1 for the root
  std::vector<int> children;      // in registration order
  std::vector<ParamInfo> params;  // owned directly; a tied parameter appears once,
                                  // under the module that registered it first
  bool is_block = false;          // a transformer block: what wrap=block makes a unit
  // Parameters this module uses but another module owns (GPT-2's lm_head
  // borrows transformer.wte.weight). Wrap policies keep an owner and its
  // borrowers in one unit: a unit resharded after its forward would free a
  // weight that a later module still reads.
  std::vector<std::string> borrowed_params;
};

}  // namespace shardfit::spec
