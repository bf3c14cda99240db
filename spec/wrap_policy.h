// Which modules become units: the groups of parameters that are flattened,
// sharded, gathered and reduced together. The module tree is a Boost.Graph
// (the "graph" of DESIGN.md) built from the module table; a wrap policy
// walks it the way PyTorch FSDP's _recursive_wrap does and returns the units,
// each with its parameters in the order they are flattened.
//
// Policies (the `wrap=` part of a candidate id):
//  - "none":   one unit, the root, holding every parameter.
//  - "block":  every module marked is_block is a unit; the root holds the rest.
//  - "size:N": FSDP's size_based_auto_wrap_policy(min_num_params=N).
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "spec/module_table.h"

namespace shardfit::spec {

// Vertex i is modules[i]; an edge runs from a module to each child,
// added in registration order so out_edges() visits children in that order.
using ModuleTree = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

// Checks that `modules` is a tree rooted at index 0 whose parent and children
// fields agree; throws std::invalid_argument naming the module otherwise.
ModuleTree build_module_tree(const std::vector<ModuleNode>& modules);

struct WrapPolicy {
  enum class Kind : uint8_t { kNone, kBlock, kSize };
  Kind kind = Kind::kNone;
  int64_t min_num_params = 0;  // kSize only

  // "none", "block", "size:N" (N a positive integer). Throws
  // std::invalid_argument naming the text otherwise.
  static WrapPolicy parse(const std::string& text);
  std::string to_string() const;
};

struct Unit {
  int root_module = 0;  // index into the module table
  std::string name;     // the root module's path, "root" for the model root
  // Modules whose own parameters this unit holds: the root module's subtree
  // minus the subtrees of units nested in it, in pre-order.
  std::vector<int> modules;
  // Flattening order: module.named_parameters() order, i.e. pre-order over
  // `modules`, each module's parameters in registration order.
  std::vector<ParamInfo> params;
  int64_t numel = 0;
};

struct UnitPartition {
  // Ordered by their root module's pre-order position: units[0] is the
  // model root, and outer units come before the units nested in them.
  std::vector<Unit> units;
  std::vector<int> module_unit;  // module index -> index of the unit holding its params
};

// What becomes of a parameter registered in two modules (a tied weight: GPT-2's
// lm_head borrows transformer.wte.weight):
//  - kKeepTogether (shardfit's engine): the owner and its borrowers stay in one
//    unit (the modules between them are not wrappable), so each parameter
//    ends up in exactly one unit and the unit numels sum to the table's
//    parameter count.
//  - kCopiedPerUnit (PyTorch FSDP 1.12/1.13): _recursive_wrap counts and
//    flattens every registration (wrap.py counts module.parameters(); each
//    FSDP instance cats the parameters still registered in its subtree into
//    its own FlatParameter, flat_param.py flatten_params), so a unit holding
//    a borrower gets its own copy of the weight and the tie is broken; within
//    one unit a parameter is flattened once.
enum class TiedParams : uint8_t { kKeepTogether, kCopiedPerUnit };

// Applies `policy` to the module tree.
UnitPartition wrap_modules(const std::vector<ModuleNode>& modules, const WrapPolicy& policy,
                           TiedParams tied = TiedParams::kKeepTogether);

}  // namespace shardfit::spec
