#include "spec/wrap_policy.h"

#include <boost/graph/depth_first_search.hpp>
#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace shardfit::spec {
namespace {

std::string module_label(const std::vector<ModuleNode>& modules, int i) {
  return "module " + std::to_string(i) + " ('" + modules[i].path + "')";
}

// FSDP never wraps containers: size_based_auto_wrap_policy's
// EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}.
bool is_container(const ModuleNode& m) { return m.type == "ModuleList" || m.type == "ModuleDict"; }

// Collects modules in post-order (children in registration order first).
class PostOrderRecorder : public boost::default_dfs_visitor {
 public:
  explicit PostOrderRecorder(std::vector<int>* order) : order_(order) {}
  void finish_vertex(ModuleTree::vertex_descriptor v, const ModuleTree&) const {
    order_->push_back(static_cast<int>(v));
  }

 private:
  std::vector<int>* order_;
};

std::vector<int> post_order(const ModuleTree& tree) {
  std::vector<int> order;
  std::vector<boost::default_color_type> colors(boost::num_vertices(tree), boost::white_color);
  boost::depth_first_visit(
      tree, 0, PostOrderRecorder(&order),
      boost::make_iterator_property_map(colors.begin(), boost::get(boost::vertex_index, tree)));
  return order;
}

// Pre-order over the subtree of `root`, not descending into other units.
void collect_unit_modules(const ModuleTree& tree, const std::vector<bool>& is_unit_root, int root,
                          std::vector<int>* out) {
  out->push_back(root);
  for (auto [e, end] = boost::out_edges(root, tree); e != end; ++e) {
    const int child = static_cast<int>(boost::target(*e, tree));
    if (!is_unit_root[child]) collect_unit_modules(tree, is_unit_root, child, out);
  }
}

void collect_pre_order(const ModuleTree& tree, int v, std::vector<int>* out) {
  out->push_back(v);
  for (auto [e, end] = boost::out_edges(v, tree); e != end; ++e) {
    collect_pre_order(tree, static_cast<int>(boost::target(*e, tree)), out);
  }
}

}  // namespace

ModuleTree build_module_tree(const std::vector<ModuleNode>& modules) {
  const int n = static_cast<int>(modules.size());
  if (n == 0)
    throw std::invalid_argument("model trace has no modules; modules[0] must be the root");
  if (modules[0].parent != -1)
    throw std::invalid_argument("modules[0] must be the root (parent -1)");
  ModuleTree tree(n);
  std::vector<int> seen_as_child(n, 0);
  for (int i = 0; i < n; ++i) {
    for (int c : modules[i].children) {
      if (c <= 0 || c >= n || modules[c].parent != i) {
        throw std::invalid_argument(module_label(modules, i) + " lists child " + std::to_string(c) +
                                    " whose parent is not it");
      }
      if (seen_as_child[c]++)
        throw std::invalid_argument(module_label(modules, c) + " has two parents");
      boost::add_edge(i, c, tree);
    }
  }
  for (int i = 1; i < n; ++i) {
    if (!seen_as_child[i]) {
      throw std::invalid_argument(module_label(modules, i) + " is not among its parent's children");
    }
  }
  return tree;
}

WrapPolicy WrapPolicy::parse(const std::string& text) {
  if (text == "none") return WrapPolicy{Kind::kNone, 0};
  if (text == "block") return WrapPolicy{Kind::kBlock, 0};
  const std::string prefix = "size:";
  if (text.rfind(prefix, 0) == 0) {
    const char* first = text.data() + prefix.size();
    const char* last = text.data() + text.size();
    int64_t n = 0;
    auto [ptr, ec] = std::from_chars(first, last, n);
    if (ec == std::errc() && ptr == last && first != last && n > 0)
      return WrapPolicy{Kind::kSize, n};
  }
  throw std::invalid_argument(
      "wrap policy '" + text +
      "' is not one of: none, block, size:N (N a positive parameter count)");
}

std::string WrapPolicy::to_string() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kBlock:
      return "block";
    case Kind::kSize:
      return "size:" + std::to_string(min_num_params);
  }
  return "none";
}

UnitPartition wrap_modules(const std::vector<ModuleNode>& modules, const WrapPolicy& policy, TiedParams tied) {
  const ModuleTree tree = build_module_tree(modules);
  const int n = static_cast<int>(modules.size());
  std::vector<bool> is_unit_root(n, false);
  is_unit_root[0] = true;  // the root is always a unit, holding what remains

  // Tied weights: a module whose subtree owns a parameter that a module
  // outside it borrows cannot be a unit (its reshard would free the weight
  // under the borrower). Mark the owner's ancestors up to, not including,
  // the lowest common ancestor with the borrower.
  std::vector<bool> wrappable(n, true);
  const bool copied = tied == TiedParams::kCopiedPerUnit;
  // A module's registrations: its own parameters, and with kCopiedPerUnit the
  // ones it borrows.
  auto registered = [&](int m) {
    std::vector<ParamInfo> ps = modules[m].params;
    if (copied)
      for (const std::string& name : modules[m].borrowed_params)
        if (const ParamOwner o = param_owner(modules, name); o.param) ps.push_back(*o.param);
    return ps;
  };
  auto ancestors = [&](int m) {
    std::vector<int> chain;
    for (int a = m; a >= 0; a = modules[a].parent) chain.push_back(a);
    return chain;
  };
  for (int borrower = 0; borrower < n && !copied; ++borrower) {
    for (const std::string& name : modules[borrower].borrowed_params) {
      const int owner = param_owner(modules, name).module;
      if (owner < 0) continue;
      const std::vector<int> up = ancestors(borrower);
      for (int a : ancestors(owner)) {
        if (std::find(up.begin(), up.end(), a) != up.end()) break;  // common ancestor
        wrappable[a] = false;
      }
    }
  }

  if (policy.kind == WrapPolicy::Kind::kBlock) {
    for (int i = 1; i < n; ++i) is_unit_root[i] = modules[i].is_block && wrappable[i];
  } else if (policy.kind == WrapPolicy::Kind::kSize) {
    // _recursive_wrap: visiting children before parents, a module's
    // unwrapped count is its own parameters plus whatever its children did
    // not put into a unit. FSDP's size_based_auto_wrap_policy wraps when
    // `nonwrapped_numel >= min_num_params` (>=, not the ">" its docstring
    // suggests); we keep >= to plan what FSDP builds.
    std::vector<int64_t> unwrapped(n, 0);
    for (int v : post_order(tree)) {
      int64_t count = 0;
      for (const ParamInfo& p : registered(v)) count += p.numel;
      for (int c : modules[v].children) count += unwrapped[c];
      if (v != 0 && !is_container(modules[v]) && wrappable[v] && count >= policy.min_num_params) {
        is_unit_root[v] = true;
        count = 0;  // all of it now lives in the new unit
      }
      unwrapped[v] = count;
    }
  }

  UnitPartition out;
  out.module_unit.assign(n, 0);
  std::vector<int> pre_order;
  collect_pre_order(tree, 0, &pre_order);
  for (int root : pre_order) {
    if (!is_unit_root[root]) continue;
    Unit unit;
    unit.root_module = root;
    unit.name = root == 0 ? "root" : modules[root].path;
    collect_unit_modules(tree, is_unit_root, root, &unit.modules);
    const int index = static_cast<int>(out.units.size());
    for (int m : unit.modules) {
      out.module_unit[m] = index;
      for (const ParamInfo& p : registered(m)) {
        const bool twice = std::any_of(unit.params.begin(), unit.params.end(),
                                       [&](const ParamInfo& q) { return q.name == p.name; });
        if (twice) continue;  // a tie inside one unit: flattened once
        unit.params.push_back(p);
        unit.numel += p.numel;
      }
    }
    out.units.push_back(std::move(unit));
  }
  return out;
}

}  // namespace shardfit::spec
