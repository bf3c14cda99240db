// PyTorch's own stack on the one walk through a step's trace (walk_step,
// step_index.h, which shardfit's engine walks too): DDP and
// ZeroRedundancyOptimizer (pytorch_ddp.cc), FSDP1 (pytorch_fsdp.cc) and
// FSDP2's fully_shard (pytorch_fsdp2.cc). The walk replays the trace's
// storages and calls the strategy's hooks where PyTorch calls them; a
// strategy is the set of hooks it installs (what its hooks allocate and
// free, each the actions of its spec::Schedule), not a replay of its own.
// Defined in pytorch_walk.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "planner/model_trace.h"
#include "planner/step_index.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

class Ledger;

// Where the walk calls a strategy. A unit is a wrapped module of the
// partition the walk is given (FSDP's instances or fully_shard groups; DDP
// wraps the model root alone: unit 0). An unset hook does nothing.
struct StepHooks {
  std::function<void(int)> pre_forward;   // a unit's forward begins (its forward pre-hook)
  std::function<void(int)> post_forward;  // a unit's forward has ended (its forward hook)
  // The model's forward has returned, before the loop's `outputs =
  // model(...)` drops the previous step's outputs (labelled stepK/forward):
  // what DDP.forward does to its outputs as it returns (_DDPSink).
  std::function<void()> forward_returns;
  std::function<void()> backward_begins;  // the loss's backward begins: the root's pre-backward hook
  std::function<void(int)> pre_backward;  // a unit's backward begins (the hook on its outputs' gradients)
  std::function<void(int)> post_backward; // a unit's backward has ended (its inputs' gradients are ready)
  // FSDP1: post_backward is the hook on the flat parameter's AccumulateGrad,
  // which runs once the backward of the views the unit's pre-forward made
  // (_use_unsharded_views) has run; the autograd engine runs the ready node
  // made latest first, and those views were made just before the unit's
  // modules ran, so they run right after its last parameter gradient. For a
  // unit whose inputs need no gradient (an embedding's ids) the trace has no
  // end of its backward until the whole backward's (the tracer's markers sit
  // on inputs that need one): with this set, such a unit's post_backward
  // runs after its last gradient and the frees its node makes (inside an
  // op), before the next allocation, module event or free outside any op
  // (the graph's teardown at the backward's end). The root's views were
  // made before any other node, so they run last: its post_backward runs as
  // the backward's last op ends, before the teardown (which the trace ends
  // the root's backward after). FSDP2 waits for the backward's end for such
  // a unit too (its root's final callback), as the trace does.
  bool post_backward_after_last_grad = false;
  // The backward's last op has run: what the autograd engine calls before
  // the graph is torn down (the frees outside any op that end the trace's
  // backward: storages only the graph held, e.g. transformers' ids, mask
  // and a scalar), such as FSDP2's _root_post_backward_final_callback,
  // queued on the engine.
  std::function<void()> backward_ends;
};

// The gradients of a tie split across units (FSDP1's kCopiedPerUnit: each
// unit that registers the weight flattens its own copy), each its module's
// unit's, kept until that unit's flat gradient is made. In the traces (one
// parameter) the borrower's backward runs first: its gradient becomes the
// parameter's .grad, and the owner's own gradient is added into it and
// freed; the borrower's is freed only then, in the owner's backward.
// Empty when every tie is inside one unit (and always for DDP and FSDP2).
struct SplitTieGrads {
  std::unordered_map<int, int64_t> owner_bytes;  // owner module -> its own gradient's bytes
  struct Borrowed {
    int owner = -1;     // the module that owns the weight
    int64_t bytes = 0;  // the gradient's bytes
  };
  std::unordered_map<int, Borrowed> borrowers;  // borrowing module -> its gradient
};
SplitTieGrads split_tie_grads(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part,
                              int64_t element_bytes);

// DDP's partition: one unit, the model root, holding every module of a
// trace whose events name modules below `num_modules`.
spec::UnitPartition whole_model_unit(int num_modules);

// Replays the indexed trace's storages on the compute stream (0) into `ledger`,
// labelled `label` (the caller sets stepK/forward; the walk switches it to
// stepK/backward as the backward begins, and the hooks allocate under it).
// The parameters' gradients (storages the backward makes and the trace
// never frees: kept by AccumulateGrad; an owner's own gradient of a split
// tie) are appended to unit_grads[unit] and left for the strategy to free;
// what the forward returns beside the loss (ModelTrace::kept_outputs) is
// appended to `outputs`, and `previous_outputs` (the last step's) freed as
// the forward returns, where a point stepK/forward is recorded; with
// `keep_outputs` false the loop keeps the loss alone (`loss =
// loss_fn(model, x)`), and the rest of `outputs` is freed there too. With
// `grad_origins`, each gradient's (module, bytes) is appended to
// (*grad_origins)[unit] beside its id in unit_grads. False on out of memory.
bool walk_pytorch_step(const StepIndex& index, const spec::UnitPartition& part, const SplitTieGrads& split_ties,
                       const std::string& step, std::string& label, const StepHooks& hooks, Ledger& ledger,
                       std::vector<std::vector<int64_t>>& unit_grads, std::vector<int64_t>& outputs,
                       std::vector<int64_t>& previous_outputs, bool keep_outputs,
                       std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins = nullptr);

}  // namespace shardfit::planner
