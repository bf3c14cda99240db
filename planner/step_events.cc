// The step simulator's first half: a trace flattened, once, into the event
// array every simulate() call walks (planner/step_simulator.h): each
// allocation and free, and each unit's forward and backward boundaries,
// labelled by where in the step they fall. The replay is step_simulator.cc.
#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "planner/step_simulator.h"

namespace shardfit::planner {
namespace {

std::string bad_trace(const ModelTrace& trace, size_t event, const std::string& what) {
  return "trace of " + trace.model_name + ": event " + std::to_string(event) + " " + what;
}

}  // namespace

// ------------------------------------------------------------ indexing

// Labels: labels_[0] = "init"; step k (0-based) starts at
// 1 + k * (2U + 1): forward/u at +u, backward/u at +U+u, optimizer at +2U.
// Event::label holds the offset within a step.
StepSimulator::StepSimulator(const ModelTrace& trace, const UnitPartition& units)
    : trace_dtype_(trace.compute_dtype) {
  const int num_modules = static_cast<int>(trace.modules.size());
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
    unit_numel_.push_back(units.units[u].numel);
    unit_params_.push_back(units.units[u].params);
  }

  // First pass: where each unit's backward first begins and last ends, and
  // the order units first run forward.
  std::vector<size_t> first_bwd_begin(num_units, SIZE_MAX), last_bwd_end(num_units, SIZE_MAX);
  std::vector<bool> ran_forward(num_units, false);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const MemEvent& e = trace.events[i];
    if (e.kind != MemEvent::kModuleBegin && e.kind != MemEvent::kModuleEnd) continue;
    if (e.module < 0 || e.module >= num_modules)
      throw std::invalid_argument(bad_trace(trace, i, "has no module"));
    const int u = unit_of_root[e.module];
    if (u < 0) continue;
    if (e.phase == Phase::kForward && e.kind == MemEvent::kModuleBegin && !ran_forward[u]) {
      ran_forward[u] = true;
      forward_order_.push_back(u);
    } else if (e.phase == Phase::kBackward) {
      if (e.kind == MemEvent::kModuleBegin && first_bwd_begin[u] == SIZE_MAX)
        first_bwd_begin[u] = i;
      if (e.kind == MemEvent::kModuleEnd) last_bwd_end[u] = i;
    }
  }
  num_run_forward_ = static_cast<int>(forward_order_.size());
  forward_pos_.assign(num_units, -1);
  for (int k = 0; k < num_run_forward_; ++k) forward_pos_[forward_order_[k]] = k;
  for (int u = 0; u < num_units; ++u) {
    if (!ran_forward[u]) forward_order_.push_back(u);
  }

  // Second pass: the flat event array, trace ids renumbered 0..T-1.
  std::unordered_map<int64_t, int32_t> dense_id;
  std::vector<bool> live;
  std::vector<int> fwd_depth(num_units, 0), rcp_depth(num_units, 0);
  std::vector<int> fwd_stack, bwd_stack;  // active units, for labels
  bool backward_started = false;
  events_.reserve(trace.events.size());
  auto stack_label = [&](bool forward) {
    const std::vector<int>& s = forward ? fwd_stack : bwd_stack;
    const int u = s.empty() ? root_unit_ : s.back();  // outside every unit: the root's phase
    return static_cast<int32_t>(forward ? u : num_units + u);
  };
  // Tracks nesting; true on the outermost begin and its matching end (an
  // unmatched end is ignored).
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
    if (!forward && !backward_started) {
      backward_started = true;
      events_.push_back(Event{Event::kBackwardStart, stack_label(false), -1, -1, 0});
    }
    switch (e.kind) {
      case MemEvent::kAlloc: {
        auto [it, inserted] = dense_id.emplace(e.tensor, static_cast<int32_t>(dense_id.size()));
        if (inserted) live.push_back(false);
        if (live[it->second])
          throw std::invalid_argument(bad_trace(trace, i, "allocates a live tensor"));
        if (e.bytes < 0)
          throw std::invalid_argument(bad_trace(trace, i, "allocates negative bytes"));
        live[it->second] = true;
        alloc_events_.push_back(static_cast<int32_t>(events_.size()));
        events_.push_back(Event{Event::kAlloc, stack_label(forward), -1, it->second, e.bytes});
        break;
      }
      case MemEvent::kFree: {
        auto it = dense_id.find(e.tensor);
        if (it == dense_id.end() || !live[it->second]) {
          throw std::invalid_argument(bad_trace(trace, i, "frees a tensor that is not live"));
        }
        live[it->second] = false;
        events_.push_back(Event{Event::kFree, stack_label(forward), -1, it->second, 0});
        break;
      }
      case MemEvent::kModuleBegin:
      case MemEvent::kModuleEnd: {
        const int u = unit_of_root[e.module];
        if (u < 0) break;
        const bool begin = e.kind == MemEvent::kModuleBegin;
        if (e.phase == Phase::kForward) {
          // Only the outermost call of a unit's root module gathers/reshards.
          if (!outermost(fwd_depth[u], begin)) break;
          if (begin) fwd_stack.push_back(u);
          events_.push_back(Event{begin ? Event::kForwardBegin : Event::kForwardEnd,
                                  stack_label(true), u, -1, 0});
          if (!begin) pop(fwd_stack, u);
        } else if (e.phase == Phase::kBackward) {
          // A unit used twice has two backward spans: FSDP's pre-backward
          // runs at the first, its post-backward (reduce-scatter) at the last.
          if (i != (begin ? first_bwd_begin[u] : last_bwd_end[u])) break;
          if (begin) bwd_stack.push_back(u);
          events_.push_back(Event{begin ? Event::kBackwardBegin : Event::kBackwardEnd,
                                  stack_label(false), u, -1, 0});
          if (!begin) pop(bwd_stack, u);
        } else if (outermost(rcp_depth[u], begin) && begin) {
          events_.push_back(Event{Event::kRecomputeBegin, stack_label(false), u, -1, 0});
        }
        break;
      }
    }
  }
  num_trace_tensors_ = static_cast<int64_t>(dense_id.size());
  for (int64_t id = 0; id < num_trace_tensors_; ++id) {
    if (live[id]) leftover_ids_.push_back(id);
  }

  labels_.push_back("init");
  for (int step = 1; step <= kSimulatedSteps; ++step) {
    const std::string prefix = "step" + std::to_string(step) + "/";
    for (const Unit& unit : units.units) labels_.push_back(prefix + "forward/" + unit.name);
    for (const Unit& unit : units.units) labels_.push_back(prefix + "backward/" + unit.name);
    labels_.push_back(prefix + "optimizer");
  }
}

void StepSimulator::set_alloc_bytes(const std::vector<int64_t>& bytes) {
  if (bytes.size() != alloc_events_.size())
    throw std::invalid_argument("set_alloc_bytes: " + std::to_string(bytes.size()) + " sizes for " +
                                std::to_string(alloc_events_.size()) + " allocations");
  for (size_t i = 0; i < bytes.size(); ++i) events_[alloc_events_[i]].bytes = bytes[i];
}

}  // namespace shardfit::planner
