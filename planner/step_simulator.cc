#include "planner/step_simulator.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "spec/schedule.h"
#include "spec/shard_layout.h"

namespace shardfit::planner {

const char* category_name(Category c) {
  switch (c) {
    case Category::kParams:
      return "params";
    case Category::kGrads:
      return "grads";
    case Category::kOptimizer:
      return "optimizer";
    case Category::kActivations:
      return "activations";
    case Category::kCommBuffers:
      return "comm_buffers";
    case Category::kTemporaries:
      return "temporaries";
    case Category::kOverhead:
      return "overhead";
  }
  return "?";
}

namespace {

// AdamW's exp_avg and exp_avg_sq, each fp32: torch.optim.AdamW's state.
constexpr int64_t kFp32Bytes = 4;

}  // namespace

// ------------------------------------------------------------ replay

// One run of init + steps through one allocator. Each unit's flat parameter
// is SHARDED (only the shard exists) or UNSHARDED (the gathered c*P_u buffer
// exists too). FSDP2's third state, SHARDED_POST_FORWARD (resharding after
// forward onto a smaller group), is not a strategy here: zero3 goes straight
// back to SHARDED.
class StepReplay {
 public:
  StepReplay(const StepSimulator& sim, const Strategy& strategy, AllocatorModel& allocator,
             const SimOptions& options, StepSimResult* result);
  void run();
  // The walk's interpreter (walk_step): false on out of memory.
  bool on(const StepEvent& ev);

 private:
  enum class ParamState : uint8_t { kSharded, kUnsharded };
  // Per-unit buffer ids: base_ + u * kNumSlots + slot.
  enum Slot : int {
    kFullParam,      // ddp/zero1: the unit's full flat param (fp32, or c bytes for zero1+offload)
    kComputeCopy,    // ddp/zero1 mixed: the c-byte copy forward/backward read
    kShardParam,     // zero2/3/hybrid: the fp32 shard
    kUnsharded,      // zero2/3/hybrid: the gathered c*P_u param
    kGatherStaging,  // low-precision cast or host-to-device copy feeding the all-gather
    kUnshardedGrad,  // zero2/3/hybrid: c*P_u grad, reduce-scatter input
    kShardGrad,      // zero2/3/hybrid: fp32 shard grad
    kReduceScatterOut,
    kExpAvg,
    kExpAvgSq,
    kDenom,    // AdamW's sqrt(v) + eps for one flat tensor
    kGradF32,  // fp32 copy of a low-precision grad for the update
    kNumSlots,
  };

  int64_t unit_id(int u, Slot s) const { return base_ + int64_t{u} * kNumSlots + s; }
  // zero2/zero3/hybrid keep only shards between uses; ddp/zero1 keep full params.
  bool sharded_params() const { return traits_.shard_params; }

  bool alloc(int64_t id, int64_t bytes, int stream, Category category);
  void free(int64_t id);
  void host_alloc(int64_t bytes);
  void mark(int label);

  bool init();
  bool replay_trace();
  // The schedule's actions for a unit's hook, or (u < 0) the step's.
  bool run_hook(spec::Hook hook, int u);
  bool apply(spec::Op op, int u);
  bool unshard(int u, bool wait = true);
  void finish_unshard(int u);
  void reshard(int u);
  bool launch_reduce_scatter(int u);
  bool finish_reduce_scatter(int u);
  void finish_all_reduce(int u);
  bool wait_reduce();
  void free_shard_grad(int u);
  bool optimizer_step();

  const StepSimulator& sim_;
  const Strategy& strategy_;
  const spec::StrategyTraits traits_;  // what strategy_ means, decoded once
  const spec::Schedule schedule_;      // what it does at each hook
  AllocatorModel& allocator_;
  const SimOptions& options_;
  StepSimResult* result_;

  const int num_units_;
  const int group_;  // N: ranks a flat param is sharded over (1 for ddp)
  const int64_t c_;  // compute dtype bytes
  const bool mixed_;
  const int root_unit_;  // the unit whose root is the model root
  const int64_t base_;   // first id after the trace's tensors
  int64_t flat_grad_id_;
  int64_t overhead_id_;
  std::vector<int64_t> padded_;  // P_u
  std::vector<int64_t> shard_;   // s_u
  int64_t total_padded_ = 0;

  bool flat_grad_live_ = false;
  bool last_micro_ = true;
  // A forward has run, so forward prefetch knows the order (the engine,
  // like FSDP, learns it in the first forward).
  bool forward_order_known_ = false;
  std::vector<ParamState> state_;
  std::vector<bool> shard_grad_live_;  // device or host, by strategy
  // Reductions launched, in launch order: units (zero2/3/hybrid) or DDP's
  // gradient buckets (ddp/zero1, buckets_).
  std::vector<int> in_flight_;
  spec::GradBuckets buckets_;
  std::vector<bool> gather_in_flight_;  // prefetched (async_gather), not yet waited for
  std::vector<bool> optimizer_state_live_;
  std::vector<uint8_t> id_category_;
  CategoryBytes category_bytes_{};
  int label_ = 0;
  int step_base_ = 0;
  int peak_allocated_label_ = 0;
  int peak_reserved_label_ = 0;
  int64_t peak_since_mark_ = 0;  // allocated bytes, for TimelinePoint
  int64_t host_bytes_ = 0;
};

StepReplay::StepReplay(const StepSimulator& sim, const Strategy& strategy,
                       AllocatorModel& allocator, const SimOptions& options, StepSimResult* result)
    : sim_(sim),
      strategy_(strategy),
      traits_(strategy.traits()),
      schedule_(traits_, strategy.schedule),
      allocator_(allocator),
      options_(options),
      result_(result),
      num_units_(sim.num_units()),
      group_(traits_.shard_group_size),
      c_(dtype_bytes(traits_.compute_dtype)),
      mixed_(traits_.mixed()),
      root_unit_(sim.index_.root_unit()),
      base_(sim.index_.num_ids()) {
  flat_grad_id_ = base_ + int64_t{num_units_} * kNumSlots;
  overhead_id_ = flat_grad_id_ + 1;
  for (int u = 0; u < num_units_; ++u) {
    padded_.push_back(spec::padded_numel(sim.unit_numel_[u], group_));
    shard_.push_back(padded_.back() / group_);
    total_padded_ += padded_.back();
  }
  if (!sharded_params()) {
    std::vector<spec::FlatParamLayout> layouts;
    for (int u = 0; u < num_units_; ++u) layouts.emplace_back(sim.unit_params_[u], group_);
    buckets_ = spec::GradBuckets(layouts, static_cast<int>(c_), strategy.schedule.ddp_bucket_cap_bytes);
  }
  state_.assign(num_units_, ParamState::kSharded);
  shard_grad_live_.assign(num_units_, false);
  gather_in_flight_.assign(num_units_, false);
  optimizer_state_live_.assign(num_units_, false);
  id_category_.assign(overhead_id_ + options.overhead_bytes.size(), 0);
}

bool StepReplay::alloc(int64_t id, int64_t bytes, int stream, Category category) {
  if (!allocator_.alloc(id, bytes, stream)) {
    result_->oom = true;
    result_->oom_label = sim_.labels_[label_];
    result_->oom_category = category;
    result_->oom_request_bytes = bytes;
    result_->oom_allocation_bytes = allocator_.allocation_size(bytes);
    result_->oom_allocated_bytes = allocator_.allocated_bytes();
    result_->oom_reserved_bytes = allocator_.reserved_bytes();
    return false;
  }
  id_category_[id] = static_cast<uint8_t>(category);
  category_bytes_[static_cast<int>(category)] += allocator_.charged_bytes(id);
  peak_since_mark_ = std::max(peak_since_mark_, allocator_.allocated_bytes());
  if (allocator_.allocated_bytes() > result_->peak_allocated_bytes) {
    result_->peak_allocated_bytes = allocator_.allocated_bytes();
    result_->peak_breakdown_bytes = category_bytes_;
    peak_allocated_label_ = label_;
  }
  if (allocator_.reserved_bytes() > result_->peak_reserved_bytes) {
    result_->peak_reserved_bytes = allocator_.reserved_bytes();
    peak_reserved_label_ = label_;
  }
  return true;
}

void StepReplay::free(int64_t id) {
  category_bytes_[id_category_[id]] -= allocator_.charged_bytes(id);  // 0 when not live
  allocator_.free(id);
}

void StepReplay::host_alloc(int64_t bytes) {
  host_bytes_ += bytes;
  result_->peak_host_bytes = std::max(result_->peak_host_bytes, host_bytes_);
}

void StepReplay::mark(int label) {
  if (!options_.record_timeline) return;
  result_->timeline.push_back(TimelinePoint{sim_.labels_[label], allocator_.allocated_bytes(),
                                            allocator_.reserved_bytes(), peak_since_mark_});
  result_->timeline_category_bytes.push_back(category_bytes_);
  peak_since_mark_ = allocator_.allocated_bytes();
}

void StepReplay::run() {
  allocator_.reset();
  label_ = 0;
  bool ok = init();
  for (int step = 0; ok && step < std::min(kSimulatedSteps, std::max(1, options_.steps)); ++step) {
    step_base_ = 1 + step * (2 * num_units_ + 1);
    label_ = step_base_;
    ok = run_hook(spec::Hook::kZeroGrad, -1);
    for (int micro = 0; ok && micro < strategy_.grad_accum; ++micro) {
      last_micro_ = micro + 1 == strategy_.grad_accum;
      ok = replay_trace();
      forward_order_known_ = true;
    }
    ok = ok && optimizer_step();
  }
  result_->peak_allocated_label = sim_.labels_[peak_allocated_label_];
  result_->peak_reserved_label = sim_.labels_[peak_reserved_label_];
  result_->num_alloc_retries = allocator_.num_alloc_retries();
}

// Fixed overheads first (they exist before the model does), then each
// unit's persistent parameter storage.
bool StepReplay::init() {
  for (size_t i = 0; i < options_.overhead_bytes.size(); ++i) {
    if (!alloc(overhead_id_ + i, options_.overhead_bytes[i], kComputeStream, Category::kOverhead))
      return false;
  }
  for (int u = 0; u < num_units_; ++u) {
    if (!sharded_params()) {
      if (traits_.offload) {
        // zero1+offload: the fp32 master shard lives on the host; the device
        // keeps only the params forward and backward read.
        host_alloc(kFp32Bytes * shard_[u]);
        if (!alloc(unit_id(u, kFullParam), c_ * padded_[u], kComputeStream, Category::kParams))
          return false;
      } else {
        if (!alloc(unit_id(u, kFullParam), kFp32Bytes * padded_[u], kComputeStream,
                   Category::kParams))
          return false;
        if (mixed_ &&
            !alloc(unit_id(u, kComputeCopy), c_ * padded_[u], kComputeStream, Category::kParams)) {
          return false;
        }
      }
    } else if (traits_.offload) {
      host_alloc(kFp32Bytes * shard_[u]);  // SHARDED, on the host
    } else if (!alloc(unit_id(u, kShardParam), kFp32Bytes * shard_[u], kComputeStream,
                      Category::kParams)) {
      return false;  // SHARDED, on the device
    }
  }
  mark(0);
  return true;
}

// zero2/3/hybrid free last step's shard grads (optimizer.zero_grad(
// set_to_none=True)), on the device or the host.
void StepReplay::free_shard_grad(int u) {
  if (!shard_grad_live_[u]) return;
  if (traits_.offload) {
    host_bytes_ -= kFp32Bytes * shard_[u];
  } else {
    free(unit_id(u, kShardGrad));
  }
  shard_grad_live_[u] = false;
}

// One micro-batch's trace, walked (walk_step), then the forward/backward
// scope ends: whatever the trace left live (the loss) goes before the
// optimizer step; then the reductions still in flight complete (the
// engine's order).
bool StepReplay::replay_trace() {
  if (!walk_step(sim_.index_, *this)) return false;
  for (int64_t id : sim_.index_.leftover_ids()) free(id);
  return run_hook(spec::Hook::kBackwardEnd, -1);
}

// What the engine does at each event of the step: the trace's storages, and
// the schedule's hooks where they run once per step (StepEvent::kHook).
bool StepReplay::on(const StepEvent& ev) {
  const bool hook_point = ev.kind == StepEvent::kBegin || ev.kind == StepEvent::kEnd;
  if (ev.kind == StepEvent::kModule || ev.kind == StepEvent::kTeardown || (hook_point && !ev.has(StepEvent::kHook)))
    return true;
  label_ = step_base_ + ev.label;
  const bool begin = ev.kind == StepEvent::kBegin;
  switch (ev.kind) {
    case StepEvent::kAlloc:
      return alloc(ev.id, ev.bytes, kComputeStream, Category::kActivations);
    case StepEvent::kFree:
      free(ev.id);
      return true;
    case StepEvent::kBackwardStart:
      buckets_.begin_backward();
      return run_hook(spec::Hook::kBackwardStart, -1);
    default:
      break;
  }
  if (ev.phase == Phase::kRecompute) return !begin || run_hook(spec::Hook::kRecompute, ev.unit);
  if (ev.phase == Phase::kForward) {
    if (begin) return run_hook(spec::Hook::kPreForward, ev.unit);
    if (!run_hook(spec::Hook::kPostForward, ev.unit)) return false;
    mark(step_base_ + ev.unit);
    return true;
  }
  if (begin) return run_hook(spec::Hook::kPreBackward, ev.unit);
  if (!run_hook(spec::Hook::kPostBackward, ev.unit)) return false;
  // ddp/zero1: the trace has no per-parameter events, so each of the
  // unit's gradients counts as arrived when its backward ends (the engine
  // counts them as autograd accumulates each; reduced in place, the buckets
  // cost no memory either way).
  if (!sharded_params()) {
    for (size_t i = 0; i < sim_.unit_params_[ev.unit].size(); ++i) {
      const int b = buckets_.param_ready(ev.unit, static_cast<int>(i));
      if (b >= 0 && !run_hook(spec::Hook::kGradReady, b)) return false;
    }
  }
  mark(step_base_ + num_units_ + ev.unit);
  return true;
}

bool StepReplay::run_hook(spec::Hook hook, int u) {
  const spec::HookContext where{u >= 0 && u == root_unit_, last_micro_};
  for (spec::Op op : schedule_.actions(hook, where)) {
    if (u >= 0) {
      if (!apply(op, u)) return false;
    } else if (op == spec::Op::kFreeShardGrad) {  // the step's: every unit
      for (int v = 0; v < num_units_; ++v) free_shard_grad(v);
    } else if (!apply(op, -1)) {
      return false;
    }
  }
  return true;
}

// What each action allocates and frees (spec/schedule.h says what it is).
bool StepReplay::apply(spec::Op op, int u) {
  switch (op) {
    case spec::Op::kGather:
      if (state_[u] == ParamState::kSharded) return unshard(u);
      finish_unshard(u);  // a prefetch in flight: wait for it
      return true;
    case spec::Op::kReshard:
      if (state_[u] == ParamState::kUnsharded) reshard(u);
      return true;
    case spec::Op::kPrefetchForward:
    case spec::Op::kPrefetchBackward: {
      // The next units in forward order, or in backward order (those that
      // ran forward just before: FSDP's _get_handle_to_prefetch).
      const StepIndex& index = sim_.index_;
      const int pos = index.forward_pos()[u];
      if (pos < 0 || (op == spec::Op::kPrefetchForward && !forward_order_known_)) return true;
      for (int k = 1, at; (at = schedule_.prefetch_position(op, pos, k, index.num_run_forward())) >= 0; ++k) {
        const int next = index.forward_order()[at];
        if (state_[next] == ParamState::kSharded && !unshard(next, !schedule_.async_gather())) return false;
      }
      return true;
    }
    case spec::Op::kAllocGrad:
      return alloc(unit_id(u, kUnshardedGrad), c_ * padded_[u], kComputeStream, Category::kGrads);
    case spec::Op::kReduceScatter:
      return launch_reduce_scatter(u);
    case spec::Op::kAllReduce:
      // A bucket (u), or every bucket not launched yet (u < 0): in place,
      // nothing to allocate.
      for (int b : buckets_.launch(u)) in_flight_.push_back(b);
      return true;
    case spec::Op::kWaitReduce:
      return wait_reduce();
    case spec::Op::kAllocFlatGrad:
      // Created once, when the first backward starts, and kept for the run.
      if (flat_grad_live_) return true;
      flat_grad_live_ = true;
      return alloc(flat_grad_id_, c_ * total_padded_, kComputeStream, Category::kGrads);
    case spec::Op::kZeroFlatGrad:
      return true;  // in place
    case spec::Op::kFreeShardGrad:
      free_shard_grad(u);
      return true;
    case spec::Op::kRebuildBuckets:
    case spec::Op::kBroadcastBuffers:
    case spec::Op::kCloneOutputs:
      break;  // PyTorch's DDP's (spec/schedule.h), never the engine's schedule
  }
  throw std::logic_error(std::string("the engine's step has no action ") + spec::op_name(op));
}

// SHARDED -> UNSHARDED: all-gather the unit's flat param. The input is the
// fp32 shard itself, unless it must first be cast to c bytes (mixed) or
// copied from the host (offload): then a c*s_u staging buffer feeds the
// gather and is freed once it is done, now or (`wait` false: a prefetch in
// flight) at finish_unshard.
bool StepReplay::unshard(int u, bool wait) {
  const bool staged = traits_.staged_gather();
  if (staged &&
      !alloc(unit_id(u, kGatherStaging), c_ * shard_[u], kCommStream, Category::kTemporaries)) {
    return false;
  }
  if (!alloc(unit_id(u, kUnsharded), c_ * padded_[u], kCommStream, Category::kParams)) return false;
  state_[u] = ParamState::kUnsharded;
  gather_in_flight_[u] = true;
  if (wait) finish_unshard(u);
  return true;
}

void StepReplay::finish_unshard(int u) {
  if (!gather_in_flight_[u]) return;
  gather_in_flight_[u] = false;
  free(unit_id(u, kGatherStaging));  // nothing when the gather was not staged
}

// UNSHARDED -> SHARDED: drop the gathered buffer; the shard was never gone.
void StepReplay::reshard(int u) {
  finish_unshard(u);  // a prefetch nobody waited for
  free(unit_id(u, kUnsharded));
  state_[u] = ParamState::kSharded;
}

// Reduce-scatter, launched: its output is allocated now, the rest waits
// for kWaitReduce. fp32: the output is the shard grad itself; once that
// exists (a later micro-batch), the unsharded grad's own slot, added from
// there. mixed: a c*s_u output upcast into (or added to) the fp32 shard
// grad; offload: the output goes device-to-host (upcast there when mixed).
bool StepReplay::launch_reduce_scatter(int u) {
  const bool accumulating = shard_grad_live_[u];
  if (!mixed_ && !traits_.offload) {
    if (!accumulating &&
        !alloc(unit_id(u, kShardGrad), kFp32Bytes * shard_[u], kCommStream, Category::kGrads))
      return false;
    shard_grad_live_[u] = true;
  } else {
    const Category out_category = mixed_ ? Category::kCommBuffers : Category::kGrads;
    if (!alloc(unit_id(u, kReduceScatterOut), c_ * shard_[u], kCommStream, out_category))
      return false;
  }
  in_flight_.push_back(u);
  return true;
}

// ... and completed: the output into the shard grad, the unsharded grad freed.
bool StepReplay::finish_reduce_scatter(int u) {
  if (mixed_ || traits_.offload) {
    if (traits_.offload) {
      if (!shard_grad_live_[u]) host_alloc(kFp32Bytes * shard_[u]);
    } else if (!shard_grad_live_[u] &&
               !alloc(unit_id(u, kShardGrad), kFp32Bytes * shard_[u], kCommStream, Category::kGrads)) {
      return false;
    }
    shard_grad_live_[u] = true;
    free(unit_id(u, kReduceScatterOut));
  }
  free(unit_id(u, kUnshardedGrad));
  return true;
}

// ddp/zero1: the flat grad all-reduced in place (no allocation); zero1 +
// offload then copies its own slice to a host fp32 grad, kept across steps.
void StepReplay::finish_all_reduce(int u) {
  if (!traits_.offload || shard_grad_live_[u]) return;
  host_alloc(kFp32Bytes * shard_[u]);
  shard_grad_live_[u] = true;
}

// Every reduction in flight completes, in launch order.
bool StepReplay::wait_reduce() {
  std::vector<int> launched;
  launched.swap(in_flight_);
  for (int x : launched) {
    if (sharded_params()) {
      if (!finish_reduce_scatter(x)) return false;
    } else {
      for (int u : buckets_.bucket_reduced(x)) finish_all_reduce(u);  // x: a bucket
    }
  }
  return true;
}

// AdamW over one flat tensor at a time (the unit's full param for ddp, its
// shard otherwise): state created lazily in step 1, then the update's
// temporaries, freed before the next tensor.
bool StepReplay::optimizer_step() {
  label_ = step_base_ + 2 * num_units_;
  const bool adamw = traits_.optimizer_states > 0;
  for (int u = 0; u < num_units_; ++u) {
    const int64_t n = traits_.shard_optimizer ? shard_[u] : padded_[u];
    if (traits_.offload) {
      // The update runs on the host; zero1 then copies its updated shard
      // back through a staging buffer and all-gathers it in place.
      if (adamw && !optimizer_state_live_[u]) host_alloc(2 * kFp32Bytes * n);
      optimizer_state_live_[u] = true;
      if (!sharded_params()) {
        if (!alloc(unit_id(u, kGatherStaging), c_ * shard_[u], kCommStream, Category::kTemporaries))
          return false;
        free(unit_id(u, kGatherStaging));
      }
      continue;
    }
    if (adamw && !optimizer_state_live_[u]) {
      if (!alloc(unit_id(u, kExpAvg), kFp32Bytes * n, kComputeStream, Category::kOptimizer))
        return false;
      if (!alloc(unit_id(u, kExpAvgSq), kFp32Bytes * n, kComputeStream, Category::kOptimizer))
        return false;
    }
    optimizer_state_live_[u] = true;
    // ddp/zero1 mixed: the fp32 master update needs an fp32 copy of the
    // c-byte grad; zero2/3 shard grads are fp32 already.
    const bool upcast_grad = mixed_ && !sharded_params();
    if (upcast_grad &&
        !alloc(unit_id(u, kGradF32), kFp32Bytes * n, kComputeStream, Category::kTemporaries)) {
      return false;
    }
    if (adamw && !alloc(unit_id(u, kDenom), kFp32Bytes * n, kComputeStream, Category::kTemporaries))
      return false;
    free(unit_id(u, kDenom));
    free(unit_id(u, kGradF32));
    // zero1: all-gather the updated shards in place; mixed ddp/zero1: refresh
    // the compute copy in place. Neither allocates.
  }
  mark(step_base_ + 2 * num_units_);
  return true;
}

// ------------------------------------------------------------ entry

// Labels: labels_[0] = "init"; step k (0-based) starts at
// 1 + k * (2U + 1): forward/u at +u, backward/u at +U+u, optimizer at +2U
// (StepEvent::label holds the offset within a step).
StepSimulator::StepSimulator(const ModelTrace& trace, const UnitPartition& units) : index_(trace, units) {
  for (const Unit& unit : units.units) {
    unit_numel_.push_back(unit.numel);
    unit_params_.push_back(unit.params);
  }
  labels_.push_back("init");
  for (int step = 1; step <= kSimulatedSteps; ++step) {
    const std::string prefix = "step" + std::to_string(step) + "/";
    for (const Unit& unit : units.units) labels_.push_back(prefix + "forward/" + unit.name);
    for (const Unit& unit : units.units) labels_.push_back(prefix + "backward/" + unit.name);
    labels_.push_back(prefix + "optimizer");
  }
}

StepSimResult StepSimulator::simulate(const Strategy& strategy, AllocatorModel& allocator,
                                      const SimOptions& options) const {
  if (strategy.grad_accum < 1) {
    throw std::invalid_argument("grad_accum " + std::to_string(strategy.grad_accum) +
                                ": must be at least 1");
  }
  (void)strategy.traits();  // spec's validator: throws for an impossible strategy
  // fp16 and bf16 allocate alike: a trace of either serves both.
  const DType trace_dtype = index_.compute_dtype();
  if (dtype_bytes(strategy.compute_dtype) != dtype_bytes(trace_dtype)) {
    throw std::invalid_argument(
        "strategy computes in " + std::to_string(dtype_bytes(strategy.compute_dtype)) +
        "-byte dtype but the trace was recorded in " + std::to_string(dtype_bytes(trace_dtype)) +
        "-byte dtype; trace it again");
  }
  StepSimResult result;
  StepReplay(*this, strategy, allocator, options, &result).run();
  return result;
}

spec::StrategyTraits Strategy::traits() const {
  const spec::Candidate c{sharding, offload, recompute, spec::precision_of(compute_dtype), "none"};
  return spec::decode_strategy(c, world_size, shard_group_size, optimizer);
}


}  // namespace shardfit::planner
