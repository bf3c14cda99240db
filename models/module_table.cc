#include "models/module_table.h"

#include <string>
#include <unordered_map>

namespace shardfit::models {

std::vector<spec::ModuleNode> module_table(TrainableModel& model) {
  std::vector<spec::ModuleNode> nodes;
  std::unordered_map<std::string, int> by_path;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    spec::ModuleNode n;
    n.path = item.key();
    auto* base = dynamic_cast<ModuleBase*>(item.value().get());
    n.type = base ? base->type_name() : item.value()->name();
    n.is_block = base && base->is_block();
    if (base) n.borrowed_params = base->borrowed_params();
    if (!n.path.empty()) {
      const auto dot = n.path.rfind('.');
      n.parent = by_path.at(dot == std::string::npos ? "" : n.path.substr(0, dot));
    }
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      spec::ParamInfo info;
      info.name = n.path.empty() ? p.key() : n.path + "." + p.key();
      info.shape = p.value().sizes().vec();
      info.numel = p.value().numel();
      n.params.push_back(info);
    }
    const int idx = static_cast<int>(nodes.size());
    by_path[n.path] = idx;
    if (n.parent >= 0) nodes[n.parent].children.push_back(idx);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

std::vector<spec::ModuleNode> module_table(const ModelConfig& config) {
  auto model = build_model(config, torch::TensorOptions().device(torch::kMeta));
  return module_table(*model);
}

}  // namespace shardfit::models
