// A training step's trace, indexed once over a unit partition, and the one
// walk through it that every simulation of a step shares: shardfit's own
// engine (StepReplay, step_simulator.cc) and PyTorch's DDP, FSDP1 and FSDP2
// (walk_pytorch_step, pytorch_walk.cc). Each is an interpreter of the same
// events and the same spec::Schedule; what differs between them is only what
// an action allocates. Built once per (trace, partition), so that a
// simulation, which the planner runs for every candidate and batch, walks a
// flat array with no string or map work.
#pragma once

#include <climits>
#include <cstdint>
#include <vector>

#include "planner/model_trace.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

struct StepEvent {
  enum Kind : uint8_t {
    kAlloc,          // trace storage `id` of `bytes`, made in `module`
    kFree,           // trace storage `id`
    kBackwardStart,  // before the step's first event outside the forward
    kBegin,          // unit `unit`'s root module begins a call, in `phase`
    kEnd,            // ... and ends it
    kModule,         // another module begins or ends a call
    // The backward's last op has run: what follows (frees and module ends
    // outside any op) is the autograd graph's teardown. Only in a trace that
    // names its ops, and only when the backward has an op.
    kTeardown,
  };
  // kBegin/kEnd where a strategy's hooks run once per step (the engine's
  // schedule points): a unit's outermost forward call, its first backward
  // begin and last backward end (a unit used twice has two backward spans:
  // FSDP's pre-backward runs at the first, its post-backward at the last),
  // the outermost begin of its recomputed forward.
  static constexpr uint8_t kHook = 1;
  static constexpr uint8_t kInOp = 2;        // inside an op (the trace names it)
  static constexpr uint8_t kKeptOutput = 4;  // kAlloc: returned by the forward (the loss too)
  // kAlloc: the loss, the kept output the recorder's loop drops last
  // (trace_recorder.py: `del out, loss`).
  static constexpr uint8_t kLoss = 8;
  Kind kind = kAlloc;
  Phase phase = Phase::kForward;
  uint8_t flags = 0;
  // Where in the step the engine labels it: forward/u (u) or backward/u
  // (num_units + u) of the innermost unit whose hooks have run (the root's
  // outside every unit).
  int32_t label = 0;
  int32_t unit = -1;
  int32_t module = -1;
  int32_t id = -1;  // dense storage id, 0..num_ids()-1
  int64_t bytes = 0;
  bool has(uint8_t flag) const { return (flags & flag) != 0; }
};

class StepIndex {
 public:
  // Throws std::invalid_argument on a malformed trace (a free of a storage
  // that is not live, a module index out of range, an allocation of a live
  // storage or of negative bytes) or a unit rooted outside it.
  StepIndex(const ModelTrace& trace, const spec::UnitPartition& units);

  const std::vector<StepEvent>& events() const { return events_; }
  DType compute_dtype() const { return compute_dtype_; }
  int64_t num_ids() const { return static_cast<int64_t>(freed_in_.size()); }
  // The module active where the trace last frees storage `id`, or
  // kNeverFreed (a gradient AccumulateGrad keeps, a kept output, the loss).
  static constexpr int32_t kNeverFreed = INT32_MIN;
  int32_t freed_in(int32_t id) const { return freed_in_[id]; }
  // Storages still live when the trace ends.
  const std::vector<int32_t>& leftover_ids() const { return leftover_ids_; }
  // Whether any event names an op (traces made by hand may name none).
  bool names_ops() const { return names_ops_; }
  // Whether some span of `unit`'s backward (or recompute) ends outside any
  // op: the tracer closing it with the whole backward, where no module hook
  // ran (PyTorch's post-backward then waits for the unit's last gradient).
  bool backward_ends_outside_op(int unit) const { return backward_ends_outside_op_[unit]; }

  // Units in the order their forward first begins (units that never run
  // forward last, in index order); each unit's place in it (-1: never runs).
  const std::vector<int>& forward_order() const { return forward_order_; }
  const std::vector<int>& forward_pos() const { return forward_pos_; }
  int num_run_forward() const { return num_run_forward_; }
  int root_unit() const { return root_unit_; }  // the unit rooted at the model root
  int num_units() const { return static_cast<int>(forward_pos_.size()); }

  // Replaces the sizes of the trace's allocations (in trace order) without
  // re-indexing: the batch search re-sizes one index per batch it tries.
  void set_alloc_bytes(const std::vector<int64_t>& bytes);

 private:
  void order_units(const ModelTrace& trace, const std::vector<int>& unit_of_root);
  void flatten(const ModelTrace& trace, const std::vector<int>& unit_of_root);

  DType compute_dtype_ = DType::kF32;
  std::vector<StepEvent> events_;
  std::vector<int32_t> alloc_events_;  // index in events_ of each allocation
  std::vector<int32_t> freed_in_;      // by dense id
  std::vector<int32_t> leftover_ids_;
  bool names_ops_ = false;
  std::vector<bool> backward_ends_outside_op_;  // by unit
  std::vector<int> forward_order_, forward_pos_;
  int num_run_forward_ = 0;
  int root_unit_ = 0;
};

// The one walk: each event of the index, in order, handed to the
// interpreter's on(event); it stops at the first that returns false (out
// of memory).
template <class Interpreter>
bool walk_step(const StepIndex& index, Interpreter& interpreter) {
  for (const StepEvent& e : index.events())
    if (!interpreter.on(e)) return false;
  return true;
}

}  // namespace shardfit::planner
