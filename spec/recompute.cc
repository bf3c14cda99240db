#include "spec/recompute.h"

namespace shardfit::spec {

std::vector<int> recompute_modules(const std::vector<ModuleNode>& modules, const UnitPartition& units) {
  std::vector<bool> chosen(modules.size(), false);
  for (const auto& u : units.units)
    if (u.root_module != 0) chosen[u.root_module] = true;
  bool any = false;
  for (bool c : chosen) any = any || c;
  if (!any)
    for (size_t m = 0; m < modules.size(); ++m) chosen[m] = modules[m].is_block;
  std::vector<int> out;
  for (size_t m = 0; m < modules.size(); ++m) {
    if (!chosen[m]) continue;
    bool nested = false;  // an ancestor already recomputes this module
    for (int p = modules[m].parent; p >= 0 && !nested; p = modules[p].parent) nested = chosen[p];
    if (!nested) out.push_back(static_cast<int>(m));
  }
  return out;
}

}  // namespace shardfit::spec
