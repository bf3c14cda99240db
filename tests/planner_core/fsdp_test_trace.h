// The trace-event helper (ev) the planner core tests share, and the
// hand-made step both FSDP tests replay (pytorch_fsdp_test.cc: 1.13's
// FSDP; pytorch_fsdp2_test.cc: FSDP2's fully_shard), on a root (module 0)
// holding one Linear (module 1), so that every figure can be added up by
// hand.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "planner/model_trace.h"
#include "planner/pytorch_stack.h"
#include "planner/step_simulator.h"

namespace shardfit::planner::fsdp_test {

// One trace event; `op` the op it happened in (-1: none).
inline MemEvent ev(MemEvent::Kind k, Phase ph, int module, int64_t tensor = -1, int64_t bytes = 0, int op = -1) {
  MemEvent e;
  e.kind = k;
  e.phase = ph;
  e.module = module;
  e.tensor = tensor;
  e.bytes = bytes;
  e.op = op;
  return e;
}

// Forward: 100 B in the root, 40 B in lin, an 8 B loss. Backward: lin's two
// gradients (10 and 2 elements of `grad_bytes`: 40 B, 8 B in fp32) kept by
// AccumulateGrad (the no-grads trace), the root's (4 elements) after lin's
// backward has ended.
inline ModelTrace step(int64_t grad_bytes = 4) {
  constexpr auto F = Phase::kForward, B = Phase::kBackward;
  ModelTrace t;
  t.grads_at_start = false;
  t.events = {ev(MemEvent::kModuleBegin, F, 0), ev(MemEvent::kAlloc, F, 0, 1, 100),
              ev(MemEvent::kModuleBegin, F, 1), ev(MemEvent::kAlloc, F, 1, 2, 40),
              ev(MemEvent::kModuleEnd, F, 1),   ev(MemEvent::kAlloc, F, 0, 3, 8),
              ev(MemEvent::kModuleEnd, F, 0),   ev(MemEvent::kFree, B, 0, 3),
              ev(MemEvent::kModuleBegin, B, 1), ev(MemEvent::kAlloc, B, 1, 4, 10 * grad_bytes),
              ev(MemEvent::kAlloc, B, 1, 5, 2 * grad_bytes), ev(MemEvent::kFree, B, 1, 2),
              ev(MemEvent::kModuleEnd, B, 1),   ev(MemEvent::kAlloc, B, 0, 6, 4 * grad_bytes),
              ev(MemEvent::kFree, B, 0, 1)};
  return t;
}

// The same with two Linears, lin1 (module 1) and lin2 (module 2), each of
// w (10) and b (2) and each a block: 100 B in the root, 40 B in each, an
// 8 B loss; backward lin2's gradients, then lin1's, then the root's.
inline ModelTrace step_two_blocks() {
  constexpr auto F = Phase::kForward, B = Phase::kBackward;
  constexpr auto Begin = MemEvent::kModuleBegin, End = MemEvent::kModuleEnd, Alloc = MemEvent::kAlloc,
                 Free = MemEvent::kFree;
  ModelTrace t;
  t.grads_at_start = false;
  t.events = {ev(Begin, F, 0),        ev(Alloc, F, 0, 1, 100), ev(Begin, F, 1),       ev(Alloc, F, 1, 2, 40),
              ev(End, F, 1),          ev(Begin, F, 2),         ev(Alloc, F, 2, 3, 40), ev(End, F, 2),
              ev(Alloc, F, 0, 4, 8),  ev(End, F, 0),           ev(Free, B, 0, 4),     ev(Begin, B, 2),
              ev(Alloc, B, 2, 5, 40), ev(Alloc, B, 2, 6, 8),   ev(Free, B, 2, 3),     ev(End, B, 2),
              ev(Begin, B, 1),        ev(Alloc, B, 1, 7, 40),  ev(Alloc, B, 1, 8, 8), ev(Free, B, 1, 2),
              ev(End, B, 1),          ev(Alloc, B, 0, 9, 16),  ev(Free, B, 0, 1)};
  return t;
}

// Its module table: the root's "ln" (4), then lin1's and lin2's w and b.
inline std::vector<ModuleNode> two_block_modules() {
  std::vector<ModuleNode> m(3);
  m[0].type = "Net";
  m[0].children = {1, 2};
  m[0].params = {ParamInfo{"ln", {4}, 4}};
  for (int i : {1, 2}) {
    const std::string name = "lin" + std::to_string(i);
    m[i].path = name;
    m[i].type = "Linear";
    m[i].parent = 0;
    m[i].is_block = true;
    m[i].params = {ParamInfo{name + ".w", {10}, 10}, ParamInfo{name + ".b", {2}, 2}};
  }
  return m;
}

// AdamW on one parameter of 10 elements (40 B): step 1 makes exp_avg and
// exp_avg_sq, then the update's sqrt and division; later steps the update.
inline ModelTrace adamw(bool first) {
  constexpr auto F = Phase::kForward;
  ModelTrace t;
  if (first) t.events = {ev(MemEvent::kAlloc, F, 0, 1, 40), ev(MemEvent::kAlloc, F, 0, 2, 40)};
  for (MemEvent e : {ev(MemEvent::kAlloc, F, 0, 3, 40), ev(MemEvent::kAlloc, F, 0, 4, 40),
                     ev(MemEvent::kFree, F, 0, 3), ev(MemEvent::kFree, F, 0, 4)})
    t.events.push_back(e);
  return t;
}

// step_two_blocks() and AdamW's two steps for each of its five parameters,
// as a simulator's inputs; `param_numels` in the order that simulator lists
// the parameters. `in` points into the object: it is not copied.
struct TwoBlockInputs {
  ModelTrace trace = step_two_blocks();
  std::vector<ModelTrace> per_param;
  PytorchDdpInputs in;
  explicit TwoBlockInputs(std::vector<int64_t> param_numels) {
    for (int i = 0; i < 5; ++i) {
      per_param.push_back(adamw(true));
      per_param.push_back(adamw(false));
    }
    in.no_grads = &trace;
    in.param_numels = std::move(param_numels);
    in.optimizer_param_steps = &per_param;
  }
  TwoBlockInputs(const TwoBlockInputs&) = delete;
  TwoBlockInputs& operator=(const TwoBlockInputs&) = delete;
};

// The timeline point labelled `label`.
inline const TimelinePoint& at(const StepSimResult& r, const std::string& label) {
  for (const auto& p : r.timeline)
    if (p.label == label) return p;
  throw std::runtime_error("no timeline point " + label);
}

}  // namespace shardfit::planner::fsdp_test
