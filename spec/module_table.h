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

// A module buffer (register_buffer): state that is not a parameter, e.g. the
// causal mask 2022's Hugging Face GPT-2 keeps per attention. DDP broadcasts
// every buffer before each forward (broadcast_buffers=True), grouped by dtype.
struct BufferInfo {
  std::string name;   // e.g. "transformer.h.0.attn.bias"
  std::vector<int64_t> shape;
  std::string dtype;  // torch's name without "torch.": "float32", "uint8", ...
  int64_t bytes = 0;  // numel x element size
};

// A dtype's element size in bytes (torch's names, as BufferInfo::dtype), or
// 0 for a name it does not know.
inline int64_t dtype_element_size(const std::string& dtype) {
  if (dtype == "bool" || dtype == "uint8" || dtype == "int8") return 1;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16") return 2;
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  return 0;
}

// torch.is_floating_point for a dtype name (as BufferInfo::dtype).
inline bool is_floating_dtype(const std::string& dtype) {
  return dtype == "float16" || dtype == "bfloat16" || dtype == "float32" || dtype == "float64";
}

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
  // Buffers owned directly, in named_buffers() order (a shared one once).
  // Only traces from Python carry them (the built-ins keep none).
  std::vector<BufferInfo> buffers;
};

// The owned parameter named `name` (a tied one is owned by the module that
// registered it first): its module's index and its entry, or {-1, nullptr}.
struct ParamOwner {
  int module = -1;
  const ParamInfo* param = nullptr;
};
inline ParamOwner param_owner(const std::vector<ModuleNode>& modules, const std::string& name) {
  for (size_t m = 0; m < modules.size(); ++m)
    for (const ParamInfo& p : modules[m].params)
      if (p.name == name) return {static_cast<int>(m), &p};
  return {};
}

}  // namespace shardfit::spec
