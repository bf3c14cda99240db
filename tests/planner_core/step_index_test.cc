// The one index of a step's trace that the engine's and PyTorch's
// simulations both walk: where a unit's hooks run, where the graph's
// teardown begins, and what each storage is.
#include "planner/step_index.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp_test_trace.h"

namespace shardfit::planner {
namespace {

constexpr Phase F = Phase::kForward, B = Phase::kBackward, R = Phase::kRecompute;

using fsdp_test::ev;  // one trace event

// A root (module 0) holding block "b" (module 1), which holds "b.inner"
// (module 2); wrap=block makes two units: the root's (0) and b's (1).
ModelTrace root_and_block(std::vector<MemEvent> events) {
  ModelTrace t;
  t.model_name = "root-and-block";
  ModuleNode root, block, inner;
  root.path = "";
  root.children = {1};
  block.path = "b";
  block.parent = 0;
  block.is_block = true;
  block.children = {2};
  inner.path = "b.inner";
  inner.parent = 1;
  for (ModuleNode* m : {&root, &block, &inner})
    m->params.push_back(ParamInfo{(m->path.empty() ? "w" : m->path + ".w"), {4}, 4});
  t.modules = {root, block, inner};
  t.events = std::move(events);
  return t;
}

spec::UnitPartition blocks(const ModelTrace& t) {
  return spec::wrap_modules(t.modules, spec::WrapPolicy::parse("block"));
}

// The (kind, phase, hook) of each of the index's events about unit `u`.
std::vector<std::string> unit_events(const StepIndex& index, int u) {
  std::vector<std::string> out;
  for (const StepEvent& e : index.events()) {
    if (e.unit != u) continue;
    std::string s = e.kind == StepEvent::kBegin ? "begin" : "end";
    s += e.phase == F ? "/forward" : e.phase == B ? "/backward" : "/recompute";
    if (e.has(StepEvent::kHook)) s += " hook";
    out.push_back(s);
  }
  return out;
}

TEST(StepIndex, AUnitsHooksRunAtItsOutermostForwardAndItsFirstAndLastBackwardSpan) {
  using K = MemEvent;
  // b calls itself once inside its forward (nested), and its backward runs
  // in two spans (two uses of its output); its recomputed forward nests too.
  const ModelTrace t =
      root_and_block({ev(K::kModuleBegin, F, 0), ev(K::kModuleBegin, F, 1),
                      ev(K::kModuleBegin, F, 1), ev(K::kModuleEnd, F, 1), ev(K::kModuleEnd, F, 1),
                      ev(K::kModuleEnd, F, 0), ev(K::kModuleBegin, B, 0), ev(K::kModuleBegin, B, 1),
                      ev(K::kModuleEnd, B, 1), ev(K::kModuleBegin, R, 1), ev(K::kModuleBegin, R, 1),
                      ev(K::kModuleEnd, R, 1), ev(K::kModuleEnd, R, 1), ev(K::kModuleBegin, B, 1),
                      ev(K::kModuleEnd, B, 1), ev(K::kModuleEnd, B, 0)});
  const StepIndex index(t, blocks(t));
  // PyTorch's hooks see every call; the engine's run at the hooked ones.
  EXPECT_EQ(unit_events(index, 1),
            (std::vector<std::string>{"begin/forward hook", "begin/forward", "end/forward",
                                      "end/forward hook", "begin/backward hook", "end/backward",
                                      "begin/recompute hook", "begin/recompute", "end/recompute",
                                      "end/recompute", "begin/backward", "end/backward hook"}));
  EXPECT_EQ(index.forward_order(), (std::vector<int>{0, 1}));
  EXPECT_EQ(index.root_unit(), 0);
  // The backward starts before its first event, once.
  int starts = 0;
  size_t start_at = 0;
  for (size_t i = 0; i < index.events().size(); ++i)
    if (index.events()[i].kind == StepEvent::kBackwardStart) ++starts, start_at = i;
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(index.events()[start_at + 1].phase, B);
  EXPECT_EQ(index.events()[start_at - 1].phase, F);
}

TEST(StepIndex, TheTeardownBeginsAfterTheBackwardsLastOp) {
  using K = MemEvent;
  // Forward: x (op 0) in b, the loss (op 1). Backward: b's gradient (op 2,
  // never freed), x freed by op 2; then, outside any op, the graph's own
  // storages freed and the modules' backward ends.
  std::vector<MemEvent> events = {
      ev(K::kModuleBegin, F, 0), ev(K::kModuleBegin, F, 1),      ev(K::kAlloc, F, 1, 10, 64, 0),
      ev(K::kModuleEnd, F, 1),   ev(K::kAlloc, F, 0, 11, 4, 1),  ev(K::kModuleEnd, F, 0),
      ev(K::kModuleBegin, B, 1), ev(K::kAlloc, B, 1, 12, 16, 2), ev(K::kFree, B, 1, 10, 0, 2),
      ev(K::kFree, B, 0, 11),    ev(K::kModuleEnd, B, 1),        ev(K::kModuleEnd, B, 0)};
  const ModelTrace t = root_and_block(events);
  const StepIndex index(t, blocks(t));
  ASSERT_TRUE(index.names_ops());
  const std::vector<StepEvent>& e = index.events();
  size_t teardown = e.size();
  for (size_t i = 0; i < e.size(); ++i)
    if (e[i].kind == StepEvent::kTeardown) teardown = i;
  ASSERT_LT(teardown, e.size());
  EXPECT_EQ(e[teardown - 1].kind, StepEvent::kFree);  // x, by the backward's last op
  EXPECT_TRUE(e[teardown - 1].has(StepEvent::kInOp));
  EXPECT_EQ(e[teardown + 1].kind, StepEvent::kFree);  // the loss, by the teardown
  EXPECT_FALSE(e[teardown + 1].has(StepEvent::kInOp));
  // b's backward ends with the whole backward, outside any op; where its
  // end runs inside an op (a module hook's marker), it does not.
  EXPECT_TRUE(index.backward_ends_outside_op(1));
  std::vector<MemEvent> hooked = events;
  hooked[10].op = 2;
  const ModelTrace t_hooked = root_and_block(hooked);
  EXPECT_FALSE(StepIndex(t_hooked, blocks(t_hooked)).backward_ends_outside_op(1));

  // A trace that names no op cannot tell the teardown apart: none.
  for (MemEvent& m : events) m.op = -1;
  const ModelTrace by_hand = root_and_block(events);
  const StepIndex plain(by_hand, blocks(by_hand));
  EXPECT_FALSE(plain.names_ops());
  for (const StepEvent& s : plain.events()) EXPECT_NE(s.kind, StepEvent::kTeardown);
}

TEST(StepIndex, EachStorageSaysWhereTheTraceFreesItIfEver) {
  using K = MemEvent;
  ModelTrace t = root_and_block(
      {ev(K::kModuleBegin, F, 0), ev(K::kAlloc, F, 0, 7, 8), ev(K::kModuleBegin, F, 2),
       ev(K::kAlloc, F, 2, 5, 32), ev(K::kAlloc, F, 2, 9, 12), ev(K::kModuleEnd, F, 2),
       ev(K::kModuleEnd, F, 0), ev(K::kModuleBegin, B, 2), ev(K::kAlloc, B, 2, 6, 16),
       ev(K::kFree, B, 2, 5), ev(K::kModuleEnd, B, 2), ev(K::kFree, B, 0, 7)});
  t.kept_outputs = {9};  // returned beside the loss
  const StepIndex index(t, blocks(t));
  // Storages renumbered in the order they are first made: 7, 5, 9, 6.
  ASSERT_EQ(index.num_ids(), 4);
  EXPECT_EQ(index.freed_in(0), 0);  // the loss, freed in the root
  EXPECT_EQ(index.freed_in(1), 2);  // an activation, freed by b.inner's backward
  EXPECT_EQ(index.freed_in(2), StepIndex::kNeverFreed);  // the kept output
  EXPECT_EQ(index.freed_in(3), StepIndex::kNeverFreed);  // a gradient AccumulateGrad keeps
  EXPECT_EQ(index.leftover_ids(), (std::vector<int32_t>{2, 3}));
  std::vector<int32_t> kept;
  for (const StepEvent& e : index.events())
    if (e.kind == StepEvent::kAlloc && e.has(StepEvent::kKeptOutput)) kept.push_back(e.id);
  EXPECT_EQ(kept, (std::vector<int32_t>{2}));
  // b.inner is no unit's root: its boundaries are plain module events.
  int others = 0;
  for (const StepEvent& e : index.events()) others += e.kind == StepEvent::kModule;
  EXPECT_EQ(others, 4);
}

TEST(StepIndex, AMalformedTraceIsRefusedNamingTheEvent) {
  using K = MemEvent;
  const ModelTrace freed_twice =
      root_and_block({ev(K::kAlloc, F, 0, 1, 8), ev(K::kFree, F, 0, 1), ev(K::kFree, B, 0, 1)});
  try {
    StepIndex index(freed_twice, blocks(freed_twice));
    FAIL() << "a second free was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "trace of root-and-block: event 2 frees a tensor that is not live");
  }
  const ModelTrace no_module = root_and_block({ev(K::kModuleBegin, F, 3)});
  EXPECT_THROW({ StepIndex index(no_module, blocks(no_module)); }, std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::planner
