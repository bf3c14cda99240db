// The one walk through a step's trace that DDP, FSDP1 and FSDP2 share
// (pytorch_walk.h), and the partitions it walks.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "planner/pytorch_walk.h"

#include "planner/pytorch_ledger.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

SplitTieGrads split_tie_grads(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part,
                              int64_t element_bytes) {
  SplitTieGrads out;
  for (size_t m = 0; m < modules.size(); ++m)
    for (const std::string& name : modules[m].borrowed_params)
      if (const spec::ParamOwner o = spec::param_owner(modules, name);
          o.param && part.module_unit[o.module] != part.module_unit[m]) {
        out.owner_bytes[o.module] = element_bytes * o.param->numel;
        out.borrowers[static_cast<int>(m)] = {o.module, element_bytes * o.param->numel};
      }
  return out;
}

spec::UnitPartition whole_model_unit(int num_modules) {
  spec::UnitPartition part;
  part.units.push_back(spec::Unit{0, "root", {}, {}, 0});
  for (int m = 0; m < num_modules; ++m) part.units[0].modules.push_back(m);
  part.module_unit.assign(static_cast<size_t>(num_modules), 0);
  return part;
}

bool walk_pytorch_step(const ModelTrace& t, const spec::UnitPartition& part, const SplitTieGrads& split_ties,
                       const std::string& step, std::string& label, const StepHooks& hooks, Ledger& ledger,
                       std::vector<std::vector<int64_t>>& unit_grads, std::vector<int64_t>& outputs,
                       std::vector<int64_t>& previous_outputs,
                       std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins) {
  auto call = [](const std::function<void(int)>& hook, int u) {
    if (hook) hook(u);
  };
  std::unordered_map<int, int> unit_at;  // wrapped module -> unit
  for (size_t u = 0; u < part.units.size(); ++u) unit_at[part.units[u].root_module] = static_cast<int>(u);
  std::unordered_set<int64_t> kept_output(t.kept_outputs.begin(), t.kept_outputs.end());
  std::unordered_map<int64_t, int> freed_in;  // trace storage -> the module active where the trace frees it
  for (const auto& e : t.events)
    if (e.kind == MemEvent::kFree) freed_in[e.tensor] = e.module;
  // A gradient of a split tie (SplitTieGrads): the owner's own, or the
  // borrower's, which the trace frees in the owner's backward.
  std::unordered_set<int> borrowed_seen;  // owners whose borrower's gradient came first
  auto split_tie_grad = [&](const MemEvent& e) {
    if (const auto own = split_ties.owner_bytes.find(e.module); own != split_ties.owner_bytes.end())
      return own->second == e.bytes;
    const auto b = split_ties.borrowers.find(e.module);
    if (b == split_ties.borrowers.end() || b->second.bytes != e.bytes) return false;
    const auto freed = freed_in.find(e.tensor);
    if (freed != freed_in.end() && freed->second != b->second.owner) return false;
    borrowed_seen.insert(b->second.owner);
    return true;
  };
  // The trace's sum of the two (AccumulateGrad adding the owner's gradient
  // to the borrower's out of place, the result kept as the one .grad): with
  // a copy per unit nothing adds them, so it is not allocated.
  auto split_tie_sum = [&](const MemEvent& e) {
    const auto own = split_ties.owner_bytes.find(e.module);
    return own != split_ties.owner_bytes.end() && own->second == e.bytes && !freed_in.count(e.tensor) &&
           borrowed_seen.count(e.module);
  };
  std::unordered_map<int64_t, int64_t> live;  // trace storage -> ledger id
  std::unordered_set<int64_t> held_grads;     // trace storages kept as a unit's parameter gradient
  // post_backward_after_last_grad: the units but the root whose backward
  // the trace ends only with the whole backward (an end with no op: no
  // marker ran), with their parameters' gradients still to come; the unit
  // whose last one came. A trace that names no op at all (made by hand)
  // cannot tell the tracer's ends from the markers': its ends stand.
  std::vector<int64_t> grads_to_come(part.units.size(), -1);
  const bool names_ops = std::any_of(t.events.begin(), t.events.end(), [](const MemEvent& e) { return e.op >= 0; });
  if (hooks.post_backward_after_last_grad && names_ops)
    for (const auto& e : t.events)
      if (const auto u = unit_at.find(e.module); u != unit_at.end() && u->second != 0 &&
                                                 e.kind == MemEvent::kModuleEnd && e.phase != Phase::kForward && e.op < 0)
        grads_to_come[u->second] = static_cast<int64_t>(part.units[u->second].params.size());
  // Where the graph's teardown begins: the trailing frees and module ends
  // outside any op, after the backward's last op (none when the trace
  // names no op: nothing to tell apart).
  size_t teardown = t.events.size();
  while (names_ops && teardown > 0 && t.events[teardown - 1].phase != Phase::kForward &&
         t.events[teardown - 1].op < 0 &&
         (t.events[teardown - 1].kind == MemEvent::kFree || t.events[teardown - 1].kind == MemEvent::kModuleEnd))
    --teardown;
  int grads_done_unit = -1;
  bool in_backward = false;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const MemEvent& e = t.events[i];
    if (ledger.oom()) return false;
    if (grads_done_unit >= 0 && (e.kind != MemEvent::kFree || e.op < 0)) {
      call(hooks.post_backward, grads_done_unit);  // runs once: the trace's end of it finds it done
      grads_done_unit = -1;
    }
    if (i == teardown && in_backward) {
      // FSDP1's root: its flat parameter's AccumulateGrad is the backward's
      // last op, so its hook runs before the teardown (the trace ends the
      // root's backward after it).
      if (hooks.post_backward_after_last_grad) call(hooks.post_backward, 0);
      if (hooks.backward_ends) hooks.backward_ends();
    }
    if (!in_backward && e.phase != Phase::kForward) {
      // The forward returned: the loop's `outputs = model(x)` drops the
      // previous step's.
      in_backward = true;
      if (hooks.forward_returns) hooks.forward_returns();
      ledger.free_all(previous_outputs);
      ledger.point(step + "/forward");
      label = step + "/backward";
      if (hooks.backward_begins) hooks.backward_begins();
    }
    const auto unit = unit_at.find(e.module);
    const bool unit_event =
        unit != unit_at.end() && (e.kind == MemEvent::kModuleBegin || e.kind == MemEvent::kModuleEnd);
    if (unit_event) {
      const bool begin = e.kind == MemEvent::kModuleBegin;
      if (e.phase == Phase::kForward) {
        call(begin ? hooks.pre_forward : hooks.post_forward, unit->second);
      } else {
        call(begin ? hooks.pre_backward : hooks.post_backward, unit->second);
      }
    } else if (e.kind == MemEvent::kAlloc && in_backward && split_tie_sum(e)) {
      continue;
    } else if (e.kind == MemEvent::kAlloc) {
      const bool output = kept_output.count(e.tensor) > 0;
      const bool grad = in_backward && !output && (!freed_in.count(e.tensor) || split_tie_grad(e));
      const int64_t id = ledger.alloc(output ? Category::kActivations : grad ? Category::kGrads : Category::kActivations,
                                      e.bytes, label, 0);
      if (id < 0) return false;
      live[e.tensor] = id;
      if (output) outputs.push_back(id);
      if (grad) {
        const int u = part.module_unit[e.module];
        unit_grads[u].push_back(id);
        if (grad_origins) (*grad_origins)[u].emplace_back(e.module, e.bytes);
        held_grads.insert(e.tensor);
        if (grads_to_come[u] > 0 && --grads_to_come[u] == 0) grads_done_unit = u;
      }
    } else if (e.kind == MemEvent::kFree && !held_grads.count(e.tensor)) {
      if (auto it = live.find(e.tensor); it != live.end()) {
        ledger.free(it->second);
        live.erase(it);
      }
    }
  }
  return !ledger.oom();
}

}  // namespace shardfit::planner
