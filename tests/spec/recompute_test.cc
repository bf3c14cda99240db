// The choice of recomputed modules on a hand-built module table: unit roots
// (never the model root, never one nested in another), or the blocks when
// the root is the only unit.
#include "spec/recompute.h"

#include <gtest/gtest.h>

namespace shardfit::spec {
namespace {

// root -> body(ModuleList) -> block0, block1 (each with a linear inside), head.
std::vector<ModuleNode> two_blocks() {
  std::vector<ModuleNode> m(7);
  auto add = [&](int i, int parent, const std::string& path, bool block, int64_t numel) {
    m[i].path = path;
    m[i].type = block ? "Block" : "Linear";
    m[i].parent = parent;
    m[i].is_block = block;
    if (numel > 0) m[i].params.push_back(ParamInfo{path + ".weight", {numel}, numel});
    if (parent >= 0) m[parent].children.push_back(i);
  };
  m[0].type = "Model";
  add(1, 0, "body", false, 0);
  m[1].type = "ModuleList";
  add(2, 1, "body.0", true, 10);
  add(3, 2, "body.0.fc", false, 100);
  add(4, 1, "body.1", true, 10);
  add(5, 4, "body.1.fc", false, 100);
  add(6, 0, "head", false, 50);
  return m;
}

TEST(RecomputeModulesTest, BlocksWhenTheRootIsTheOnlyUnit) {
  const auto modules = two_blocks();
  const auto none = wrap_modules(modules, WrapPolicy::parse("none"));
  EXPECT_EQ(recompute_modules(modules, none), (std::vector<int>{2, 4}));
  EXPECT_EQ(recompute_modules(modules, wrap_modules(modules, WrapPolicy::parse("block"))), (std::vector<int>{2, 4}));
}

TEST(RecomputeModulesTest, UnitRootsButNoneNestedInAnother) {
  const auto modules = two_blocks();
  // size:100 wraps each fc (100 >= 100); a block then holds 10, head 50: neither is a unit.
  const auto units = wrap_modules(modules, WrapPolicy::parse("size:100"));
  const auto chosen = recompute_modules(modules, units);
  EXPECT_EQ(chosen, (std::vector<int>{3, 5}));
  for (int m : chosen)
    for (int q : chosen)
      for (int p = modules[m].parent; p >= 0; p = modules[p].parent) EXPECT_NE(p, q);
}

}  // namespace
}  // namespace shardfit::spec
