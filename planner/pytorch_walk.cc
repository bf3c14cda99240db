// PyTorch's interpreter of the one walk through a step's trace
// (step_index.h), which DDP, FSDP1 and FSDP2 share (pytorch_walk.h), and
// the partitions it walks.
#include <functional>
#include <string>
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

namespace {

// PyTorch's interpreter of the walk (walk_step): the trace's storages into
// the ledger, the strategy's hooks where PyTorch calls them.
class PytorchStep {
 public:
  PytorchStep(const StepIndex& index, const spec::UnitPartition& part, const SplitTieGrads& split_ties,
              const std::string& step, std::string& label, const StepHooks& hooks, Ledger& ledger,
              std::vector<std::vector<int64_t>>& unit_grads, std::vector<int64_t>& outputs,
              std::vector<int64_t>& previous_outputs, bool keep_outputs,
              std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins)
      : index_(index), part_(part), split_ties_(split_ties), step_(step), label_(label), hooks_(hooks),
        ledger_(ledger), unit_grads_(unit_grads), outputs_(outputs), previous_outputs_(previous_outputs),
        keep_outputs_(keep_outputs), grad_origins_(grad_origins), live_(index.num_ids(), -1), held_grad_(index.num_ids(), false),
        grads_to_come_(part.units.size(), -1) {
    // post_backward_after_last_grad: the units but the root whose backward
    // the trace ends only with the whole backward (an end with no op: no
    // marker ran), with their parameters' gradients still to come. A trace
    // that names no op at all (made by hand) cannot tell the tracer's ends
    // from the markers': its ends stand.
    if (hooks.post_backward_after_last_grad && index.names_ops())
      for (int u = 1; u < static_cast<int>(part.units.size()); ++u)
        if (index.backward_ends_outside_op(u)) grads_to_come_[u] = static_cast<int64_t>(part.units[u].params.size());
  }

  bool on(const StepEvent& e);

 private:
  static void call(const std::function<void(int)>& hook, int u) {
    if (hook) hook(u);
  }
  bool split_tie_grad(const StepEvent& e);
  bool split_tie_sum(const StepEvent& e) const;
  bool alloc(const StepEvent& e);

  const StepIndex& index_;
  const spec::UnitPartition& part_;
  const SplitTieGrads& split_ties_;
  const std::string& step_;
  std::string& label_;
  const StepHooks& hooks_;
  Ledger& ledger_;
  std::vector<std::vector<int64_t>>& unit_grads_;
  std::vector<int64_t>& outputs_;
  std::vector<int64_t>& previous_outputs_;
  const bool keep_outputs_;
  int64_t loss_ = -1;  // the loss's ledger id, once allocated
  std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins_;
  std::vector<int64_t> live_;     // trace storage -> ledger id, -1 when not in the ledger
  std::vector<bool> held_grad_;   // trace storages kept as a unit's parameter gradient
  std::vector<int64_t> grads_to_come_;
  std::unordered_set<int> borrowed_seen_;  // owners whose borrower's gradient came first
  int grads_done_unit_ = -1;               // the unit whose last gradient came
  bool in_backward_ = false;
};

bool PytorchStep::on(const StepEvent& e) {
  if (ledger_.oom()) return false;
  if (grads_done_unit_ >= 0 && (e.kind != StepEvent::kFree || !e.has(StepEvent::kInOp))) {
    call(hooks_.post_backward, grads_done_unit_);  // runs once: the trace's end of it finds it done
    grads_done_unit_ = -1;
  }
  switch (e.kind) {
    case StepEvent::kTeardown:
      // FSDP1's root: its flat parameter's AccumulateGrad is the backward's
      // last op, so its hook runs before the teardown (the trace ends the
      // root's backward after it).
      if (hooks_.post_backward_after_last_grad) call(hooks_.post_backward, 0);
      if (hooks_.backward_ends) hooks_.backward_ends();
      break;
    case StepEvent::kBackwardStart:
      // The forward returned: the loop's `outputs = model(x)` drops the
      // previous step's.
      in_backward_ = true;
      if (hooks_.forward_returns) hooks_.forward_returns();
      if (!keep_outputs_) {  // a loss function returned the loss alone: the rest goes with `outputs`
        for (int64_t id : outputs_)
          if (id != loss_) ledger_.free(id);
        outputs_.assign(loss_ >= 0 ? 1 : 0, loss_);
      }
      ledger_.free_all(previous_outputs_);
      ledger_.point(step_ + "/forward");
      label_ = step_ + "/backward";
      if (hooks_.backward_begins) hooks_.backward_begins();
      break;
    case StepEvent::kBegin:
    case StepEvent::kEnd: {
      const bool begin = e.kind == StepEvent::kBegin;
      if (e.phase == Phase::kForward) {
        call(begin ? hooks_.pre_forward : hooks_.post_forward, e.unit);
      } else {
        call(begin ? hooks_.pre_backward : hooks_.post_backward, e.unit);
      }
      break;
    }
    case StepEvent::kAlloc:
      return alloc(e);
    case StepEvent::kFree:
      if (!held_grad_[e.id] && live_[e.id] >= 0) {
        ledger_.free(live_[e.id]);
        live_[e.id] = -1;
      }
      break;
    case StepEvent::kModule:
      break;
  }
  return true;
}

// A trace storage: a gradient the strategy keeps (made in the backward and
// never freed by the trace: kept by AccumulateGrad; or a split tie's), an
// output the loop keeps, or an activation.
bool PytorchStep::alloc(const StepEvent& e) {
  if (in_backward_ && split_tie_sum(e)) return true;
  const bool output = e.has(StepEvent::kKeptOutput);
  const bool grad = in_backward_ && !output && (index_.freed_in(e.id) == StepIndex::kNeverFreed || split_tie_grad(e));
  const int64_t id = ledger_.alloc(output ? Category::kActivations : grad ? Category::kGrads : Category::kActivations,
                                   e.bytes, label_, 0);
  if (id < 0) return false;
  live_[e.id] = id;
  if (output) outputs_.push_back(id);
  if (e.has(StepEvent::kLoss)) loss_ = id;
  if (grad) {
    const int u = part_.module_unit[e.module];
    unit_grads_[u].push_back(id);
    if (grad_origins_) (*grad_origins_)[u].emplace_back(e.module, e.bytes);
    held_grad_[e.id] = true;
    if (grads_to_come_[u] > 0 && --grads_to_come_[u] == 0) grads_done_unit_ = u;
  }
  return true;
}

// A gradient of a split tie (SplitTieGrads): the owner's own, or the
// borrower's, which the trace frees in the owner's backward.
bool PytorchStep::split_tie_grad(const StepEvent& e) {
  if (const auto own = split_ties_.owner_bytes.find(e.module); own != split_ties_.owner_bytes.end())
    return own->second == e.bytes;
  const auto b = split_ties_.borrowers.find(e.module);
  if (b == split_ties_.borrowers.end() || b->second.bytes != e.bytes) return false;
  const int32_t freed = index_.freed_in(e.id);
  if (freed != StepIndex::kNeverFreed && freed != b->second.owner) return false;
  borrowed_seen_.insert(b->second.owner);
  return true;
}

// The trace's sum of the two (AccumulateGrad adding the owner's gradient to
// the borrower's out of place, the result kept as the one .grad): with a
// copy per unit nothing adds them, so it is not allocated.
bool PytorchStep::split_tie_sum(const StepEvent& e) const {
  const auto own = split_ties_.owner_bytes.find(e.module);
  return own != split_ties_.owner_bytes.end() && own->second == e.bytes &&
         index_.freed_in(e.id) == StepIndex::kNeverFreed && borrowed_seen_.count(e.module);
}

}  // namespace

bool walk_pytorch_step(const StepIndex& index, const spec::UnitPartition& part, const SplitTieGrads& split_ties,
                       const std::string& step, std::string& label, const StepHooks& hooks, Ledger& ledger,
                       std::vector<std::vector<int64_t>>& unit_grads, std::vector<int64_t>& outputs,
                       std::vector<int64_t>& previous_outputs, bool keep_outputs,
                       std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins) {
  PytorchStep interpreter(index, part, split_ties, step, label, hooks, ledger, unit_grads, outputs, previous_outputs,
                          keep_outputs, grad_origins);
  return walk_step(index, interpreter) && !ledger.oom();
}

}  // namespace shardfit::planner
