// Simulates the device memory of a short training run on ONE rank: init,
// step 1 and step 2 (AdamW creates its state lazily inside step 1's optimizer
// step, so step 2 is the steady state). The traced activation events are
// replayed in order, and around them the simulator adds what the sharding
// strategy does at unit boundaries: gathers and frees of flat parameters,
// gradient buffers, reduce-scatter outputs, mixed-precision casts, offload
// staging, and the optimizer step. Every buffer goes through an
// AllocatorModel, so the peak is what that allocator would report.
//
// Which actions a strategy takes at each hook of a unit (gather, reshard,
// prefetch, reduce-scatter, all-reduce, ...) is spec::Schedule
// (spec/schedule.h), decided once from spec::StrategyTraits for both this
// simulator and the executor's engine; each interprets the actions, this one
// by charging their buffers. The optimizer step is interpreted whole by
// each. What the actions allocate, by strategy: With P_u a unit's flat numel padded to the shard group N
// (shard_layout.h), s_u = P_u / N its shard and c the compute dtype's bytes:
//  - ddp: fp32 flat params 4*P_u per unit (mixed: plus a persistent c*P_u
//    compute copy); one flat grad buffer c*sum(P_u) allocated when step 1's
//    backward starts and kept; all-reduce in place; AdamW on full params.
//    P_u is not padded (N = 1): nothing is sharded.
//  - zero1: params and grads as ddp; AdamW state sharded (8*s_u); after the
//    update the shards are all-gathered in place into the full params.
//  - zero2: fp32 shards 4*s_u; gathered (c*P_u) at forward begin and kept
//    through backward; unsharded grad c*P_u from backward begin; at backward
//    end reduce-scattered into an fp32 shard grad 4*s_u (kept until the next
//    zero_grad) and the unsharded param and grad are freed.
//  - zero3: zero2, but the unsharded param is freed at forward end (the root
//    unit's only after its backward), re-gathered at backward begin, and
//    backward prefetch gathers the unit that runs backward next.
//  - hybrid: zero3 within a shard group of N = GPUs per node.
//  - +offload: fp32 shards, shard grads and AdamW state live in host memory
//    (peak_host_bytes); gathers go through a c*s_u host-to-device staging
//    buffer; the optimizer runs on the host. zero1+offload keeps only the
//    c*P_u compute params and the flat grads on the device.
// Trace tensors still live when a step's backward ends (the loss) are freed
// before the optimizer step, as the executor's forward/backward scope ends.
//
// Gradient accumulation (Strategy::grad_accum = k micro-batches per step):
// zero_grad, then the trace (forward, backward, the hooks around them) k
// times, then one optimizer step. What persists across micro-batches is the
// accumulated gradient: ddp/zero1's flat grad (all-reduced on the last
// micro-batch only, DDP's no_sync, which allocates nothing either way), and
// zero2/3/hybrid's fp32 shard grads, allocated at a unit's first
// post-backward and added to after that: fp32 reduce-scatters into its own
// slot of the unsharded grad, then adds; mixed/offload still allocate the
// c*s_u reduce-scatter output every micro-batch. Unsharded params and grads
// live and die per micro-batch as in a step without accumulation, so from
// micro-batch 2 on every unit's shard grad is live through forward and
// backward: that is the extra memory accumulation costs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "planner/allocator_model.h"
#include "planner/candidate.h"  // Sharding, sharding_name()
#include "planner/model_trace.h"
#include "planner/step_index.h"
#include "spec/schedule.h"
#include "spec/strategy.h"
#include "spec/timeline.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

// The breakdown keys of SPEC.md's plan JSON, in that order.
enum class Category : uint8_t {
  kParams,
  kGrads,
  kOptimizer,
  kActivations,
  kCommBuffers,
  kTemporaries,
  kOverhead,
};
inline constexpr int kNumCategories = 7;
// "params", "grads", "optimizer", "activations", "comm_buffers",
// "temporaries", "overhead".
const char* category_name(Category c);
using CategoryBytes = std::array<int64_t, kNumCategories>;

using spec::Optimizer;  // kAdamW (2 fp32 states per element), kSgd (none)
// Units come from the spec layer's wrap policy.
using spec::Unit;
using spec::UnitPartition;
using spec::WrapPolicy;
using spec::wrap_modules;

// Allocation streams: the caching allocator never hands a block cached on
// one stream to another.
inline constexpr int kComputeStream = 0;
inline constexpr int kCommStream =
    1;  // all-gather outputs, reduce-scatter buffers, casts feeding them

// The simulator's inputs; what they mean is decoded by spec::decode_strategy
// (traits()), which also validates them.
struct Strategy {
  Sharding sharding = Sharding::kDdp;
  bool offload = false;    // zero1/zero2/zero3/hybrid only
  bool recompute = false;  // informational: the recomputation is already in the trace
  // kF32: fp32 everywhere. kF16/kBF16: mixed precision, 2-byte compute
  // params and grads, fp32 master weights and optimizer state. Must match
  // ModelTrace::compute_dtype.
  DType compute_dtype = DType::kF32;
  Optimizer optimizer = Optimizer::kAdamW;
  int world_size = 1;
  // Ranks a flat parameter is sharded over: world_size for zero1/2/3, GPUs
  // per node for hybrid; ignored for ddp.
  int shard_group_size = 1;
  // --prefetch, --async-reduce, --async-gather (spec::ScheduleOptions).
  spec::ScheduleOptions schedule;
  // Micro-batches per optimizer step (the executor's --grad-accum): each
  // replays the whole trace and marks its forward/backward labels again.
  int grad_accum = 1;

  // The traits of these fields (wrap: irrelevant here, "none"). Throws
  // std::invalid_argument for an impossible strategy (spec's validator).
  spec::StrategyTraits traits() const;
};

// The most training steps a simulation replays (and labels): step 1 creates
// the optimizer state, step 2 is the steady state every later step repeats.
inline constexpr int kSimulatedSteps = 2;

struct SimOptions {
  // Fixed device allocations made before anything else (CUDA context,
  // library workspaces, communicator buffers), category "overhead".
  std::vector<int64_t> overhead_bytes;
  // The batch search only needs peaks: skip building the timeline.
  bool record_timeline = true;
  // Training steps to replay after init: 2 reaches the steady state (the
  // plan's default); 1 predicts a `run --steps 1` (no second step).
  int steps = kSimulatedSteps;
};

using spec::TimelinePoint;

struct StepSimResult {
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  std::string peak_allocated_label;  // the phase that set each peak
  std::string peak_reserved_label;
  CategoryBytes peak_breakdown_bytes{};  // allocated bytes at the allocated peak
  int64_t num_alloc_retries = 0;
  bool oom = false;
  std::string oom_label;                           // phase of the failed allocation
  Category oom_category = Category::kActivations;  // what it was for
  int64_t oom_request_bytes = 0;
  // At the failed allocation, what PyTorch's OOM message reports: the size
  // it tried to allocate (AllocatorModel::allocation_size), and the
  // allocated and reserved bytes then.
  int64_t oom_allocation_bytes = 0;
  int64_t oom_allocated_bytes = 0;
  int64_t oom_reserved_bytes = 0;
  int64_t peak_host_bytes = 0;          // offload: host-resident shards, grads, state
  // A point after each phase (its peak_allocated_bytes, the meter's per
  // mark, is where a phase's transient peak shows); empty if not recorded.
  std::vector<TimelinePoint> timeline;
  std::vector<CategoryBytes> timeline_category_bytes;  // allocated, by category, at each point
};

// Built once per (trace, units): the trace's StepIndex (step_index.h),
// which simulate(), called by the planner for every candidate and batch,
// walks with the engine's interpreter (StepReplay).
class StepSimulator {
 public:
  // Throws std::invalid_argument on a malformed trace (StepIndex).
  StepSimulator(const ModelTrace& trace, const UnitPartition& units);

  // Resets `allocator` and runs init, step 1 and step 2 through it, stopping at
  // the first allocation that does not fit. Throws std::invalid_argument on an
  // impossible strategy (offload with ddp, world not a multiple of the shard
  // group, compute dtype other than the trace's, grad_accum < 1).
  StepSimResult simulate(const Strategy& strategy, AllocatorModel& allocator,
                         const SimOptions& options = {}) const;

  // Units in the order their forward first begins in the trace (units that
  // never run come last, in index order).
  const std::vector<int>& forward_order() const { return index_.forward_order(); }

  // Replaces the sizes of the trace's allocations (in trace order) without
  // re-indexing: the batch search re-sizes one simulator per batch it tries
  // (AffineTrace::alloc_bytes) instead of building a new one.
  void set_alloc_bytes(const std::vector<int64_t>& bytes) { index_.set_alloc_bytes(bytes); }
  int num_units() const { return static_cast<int>(unit_numel_.size()); }
  int64_t num_trace_tensors() const { return index_.num_ids(); }

 private:
  friend class StepReplay;

  StepIndex index_;
  std::vector<int64_t> unit_numel_;
  std::vector<std::vector<spec::ParamInfo>> unit_params_;  // each unit's, in flattening order
  std::vector<std::string> labels_;  // "init", then per step: forward/u, backward/u, optimizer
};

}  // namespace shardfit::planner
