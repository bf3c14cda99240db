// A step's trace flattened, once, into the events every simulation of a
// step walks (planner/step_index.h).
#include "planner/step_index.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace shardfit::planner {
namespace {

std::string bad_trace(const ModelTrace& trace, size_t event, const std::string& what) {
  return "trace of " + trace.model_name + ": event " + std::to_string(event) + " " + what;
}

// Where the graph's teardown begins: the trailing frees and module ends
// outside any op, after the backward's last op (the trace's size when the
// trace names no op: nothing to tell apart, or when nothing trails).
size_t teardown_start(const ModelTrace& t, bool names_ops) {
  size_t i = t.events.size();
  while (names_ops && i > 0 && t.events[i - 1].phase != Phase::kForward && t.events[i - 1].op < 0 &&
         (t.events[i - 1].kind == MemEvent::kFree || t.events[i - 1].kind == MemEvent::kModuleEnd))
    --i;
  return i;
}

}  // namespace

StepIndex::StepIndex(const ModelTrace& trace, const spec::UnitPartition& units)
    : compute_dtype_(trace.compute_dtype) {
  // The trace's module table, or the partition's modules where the table is
  // shorter (a trace made by hand may name modules it has no table of).
  const int num_modules =
      static_cast<int>(std::max(trace.modules.size(), units.module_unit.size()));
  const int num_units = static_cast<int>(units.units.size());
  if (num_units == 0) throw std::invalid_argument("step simulator needs at least one unit");
  std::vector<int> unit_of_root(num_modules, -1);
  for (int u = 0; u < num_units; ++u) {
    const int root = units.units[u].root_module;
    if (root < 0 || root >= num_modules) {
      throw std::invalid_argument("unit " + units.units[u].name + " has root module " +
                                  std::to_string(root) + " outside the trace's " +
                                  std::to_string(num_modules) + " modules");
    }
    unit_of_root[root] = u;
    if (root == 0) root_unit_ = u;
  }
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const MemEvent& e = trace.events[i];
    if ((e.kind == MemEvent::kModuleBegin || e.kind == MemEvent::kModuleEnd) &&
        (e.module < 0 || e.module >= num_modules))
      throw std::invalid_argument(bad_trace(trace, i, "has no module"));
    names_ops_ = names_ops_ || e.op >= 0;
  }
  forward_pos_.assign(num_units, -1);
  order_units(trace, unit_of_root);
  flatten(trace, unit_of_root);
  backward_ends_outside_op_.assign(num_units, false);
  for (const StepEvent& e : events_)
    if (e.kind == StepEvent::kEnd && e.phase != Phase::kForward && !e.has(StepEvent::kInOp))
      backward_ends_outside_op_[e.unit] = true;
}

// The order units first run forward.
void StepIndex::order_units(const ModelTrace& trace, const std::vector<int>& unit_of_root) {
  for (const MemEvent& e : trace.events) {
    if (e.kind != MemEvent::kModuleBegin || e.phase != Phase::kForward) continue;
    const int u = unit_of_root[e.module];
    if (u >= 0 && forward_pos_[u] < 0) {
      forward_pos_[u] = static_cast<int>(forward_order_.size());
      forward_order_.push_back(u);
    }
  }
  num_run_forward_ = static_cast<int>(forward_order_.size());
  for (int u = 0; u < static_cast<int>(forward_pos_.size()); ++u)
    if (forward_pos_[u] < 0) forward_order_.push_back(u);
}

// The flat event array, trace storages renumbered 0..T-1.
void StepIndex::flatten(const ModelTrace& trace, const std::vector<int>& unit_of_root) {
  const int num_units = this->num_units();
  // Where each unit's backward first begins and last ends.
  std::vector<size_t> first_bwd_begin(num_units, SIZE_MAX), last_bwd_end(num_units, SIZE_MAX);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const MemEvent& e = trace.events[i];
    if ((e.kind != MemEvent::kModuleBegin && e.kind != MemEvent::kModuleEnd) ||
        e.phase != Phase::kBackward)
      continue;
    const int u = unit_of_root[e.module];
    if (u < 0) continue;
    if (e.kind == MemEvent::kModuleBegin && first_bwd_begin[u] == SIZE_MAX) first_bwd_begin[u] = i;
    if (e.kind == MemEvent::kModuleEnd) last_bwd_end[u] = i;
  }
  const size_t teardown = teardown_start(trace, names_ops_);
  std::unordered_map<int64_t, int32_t> dense_id;
  std::vector<bool> live;
  const std::unordered_set<int64_t> kept_output(trace.kept_outputs.begin(),
                                                trace.kept_outputs.end());
  std::vector<int> fwd_depth(num_units, 0), rcp_depth(num_units, 0);
  std::vector<int> fwd_stack, bwd_stack;  // units whose hooks have run, for labels
  bool backward_started = false;
  events_.reserve(trace.events.size() + 2);
  auto stack_label = [&](bool forward) {
    const std::vector<int>& s = forward ? fwd_stack : bwd_stack;
    const int u = s.empty() ? root_unit_ : s.back();  // outside every unit: the root's phase
    return static_cast<int32_t>(forward ? u : num_units + u);
  };
  // Tracks nesting; true on the outermost begin and its matching end (an
  // unmatched end is not).
  auto outermost = [](int& depth, bool begin) {
    if (begin) return depth++ == 0;
    if (depth == 0) return false;
    return --depth == 0;
  };
  auto pop = [](std::vector<int>& s, int u) {
    auto it = std::find(s.rbegin(), s.rend(), u);
    if (it != s.rend()) s.erase(std::next(it).base());
  };
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const MemEvent& e = trace.events[i];
    const bool forward = e.phase == Phase::kForward;
    if (i == teardown && backward_started)
      events_.push_back(
          StepEvent{StepEvent::kTeardown, e.phase, 0, stack_label(false), -1, -1, -1, 0});
    if (!forward && !backward_started) {
      backward_started = true;
      events_.push_back(
          StepEvent{StepEvent::kBackwardStart, e.phase, 0, stack_label(false), -1, -1, -1, 0});
    }
    StepEvent ev{StepEvent::kAlloc,
                 e.phase,
                 static_cast<uint8_t>(e.op >= 0 ? StepEvent::kInOp : 0),
                 stack_label(forward),
                 -1,
                 e.module,
                 -1,
                 0};
    switch (e.kind) {
      case MemEvent::kAlloc: {
        auto [it, inserted] = dense_id.emplace(e.tensor, static_cast<int32_t>(dense_id.size()));
        if (inserted) {
          live.push_back(false);
          freed_in_.push_back(kNeverFreed);
        }
        if (live[it->second])
          throw std::invalid_argument(bad_trace(trace, i, "allocates a live tensor"));
        if (e.bytes < 0)
          throw std::invalid_argument(bad_trace(trace, i, "allocates negative bytes"));
        live[it->second] = true;
        ev.id = it->second;
        ev.bytes = e.bytes;
        if (kept_output.count(e.tensor)) ev.flags |= StepEvent::kKeptOutput;
        if (!trace.kept_outputs.empty() && e.tensor == trace.kept_outputs.back()) ev.flags |= StepEvent::kLoss;
        alloc_events_.push_back(static_cast<int32_t>(events_.size()));
        break;
      }
      case MemEvent::kFree: {
        auto it = dense_id.find(e.tensor);
        if (it == dense_id.end() || !live[it->second])
          throw std::invalid_argument(bad_trace(trace, i, "frees a tensor that is not live"));
        live[it->second] = false;
        freed_in_[it->second] = e.module;
        ev.kind = StepEvent::kFree;
        ev.id = it->second;
        break;
      }
      case MemEvent::kModuleBegin:
      case MemEvent::kModuleEnd: {
        const int u = unit_of_root[e.module];
        const bool begin = e.kind == MemEvent::kModuleBegin;
        ev.kind = u < 0 ? StepEvent::kModule : begin ? StepEvent::kBegin : StepEvent::kEnd;
        ev.unit = u;
        if (u < 0) break;
        bool hook = false;
        if (forward) {
          hook = outermost(fwd_depth[u], begin);
        } else if (e.phase == Phase::kBackward) {
          hook = i == (begin ? first_bwd_begin[u] : last_bwd_end[u]);
        } else {
          hook = outermost(rcp_depth[u], begin) && begin;
        }
        if (!hook) break;
        ev.flags |= StepEvent::kHook;
        std::vector<int>* stack = forward                       ? &fwd_stack
                                  : e.phase == Phase::kBackward ? &bwd_stack
                                                                : nullptr;
        if (stack && begin) stack->push_back(u);
        ev.label = stack_label(forward);
        if (stack && !begin) pop(*stack, u);
        break;
      }
    }
    events_.push_back(ev);
  }
  for (int32_t id = 0; id < static_cast<int32_t>(live.size()); ++id)
    if (live[id]) leftover_ids_.push_back(id);
}

void StepIndex::set_alloc_bytes(const std::vector<int64_t>& bytes) {
  if (bytes.size() != alloc_events_.size())
    throw std::invalid_argument("set_alloc_bytes: " + std::to_string(bytes.size()) + " sizes for " +
                                std::to_string(alloc_events_.size()) + " allocations");
  for (size_t i = 0; i < bytes.size(); ++i) events_[alloc_events_[i]].bytes = bytes[i];
}

}  // namespace shardfit::planner
