// Step time: how long one training step of one candidate takes on one rank,
// and so the global tokens/s the plan ranks candidates by. A roofline-style
// model, deliberately simple, because its job is to order strategies and give
// the right magnitude, not to predict to the percent:
//
//  - Compute: the trace's matmul FLOPs / (peak FLOP/s of the compute dtype ×
//    the profile's efficiency). Forward and backward separately (backward
//    includes the recompute under +ckpt). The efficiency absorbs everything
//    the FLOP count leaves out (elementwise ops, launches).
//    A profile with kernels measured on this machine (`shardfit calibrate`:
//    DeviceProfile::measured_kernels) times the trace op by op instead
//    (PhaseWork): each matrix product's FLOPs at the measured rate of its
//    shape, the other kernels' bytes (inputs read, outputs allocated) at the
//    measured memory bandwidth, and each kernel and autograd node one
//    measured dispatch overhead. Nothing there is an efficiency: each term
//    is a rate this machine achieved on that kind of op.
//  - Communication, per rank, ring algorithms over n ranks: an all-gather or
//    reduce-scatter of M bytes moves (n−1)/n·M, an all-reduce 2(n−1)/n·M.
//      ddp    all-reduce of each unit's grads after its backward (the
//             engine reduces per wrap unit, not in DDP's 25 MiB buckets).
//      zero1  the same, plus an all-gather of the updated fp32 params after
//             the optimizer step.
//      zero2  all-gather of params in forward (kept through backward),
//             reduce-scatter of grads in backward.
//      zero3  all-gather in forward, again in backward, reduce-scatter in
//             backward.
//      hybrid zero3 inside a node (shard group), plus an all-reduce of each
//             grad shard across nodes over the inter-node link.
//    Params travel in the compute dtype, grads are reduced in it (SPEC: mixed
//    precision reduces in low precision; PyTorch's autocast keeps fp32
//    gradients, FSDP's reduce_dtype picks one: reduce_elem_bytes). Rates: the GPU link inside a node;
//    a ring that spans nodes runs at the slower of GPU and inter-node link.
//  - Overlap, per phase, as the schedule runs it (spec/schedule.h; the
//    inputs' prefetch, async_reduce, async_gather): phase time = max(compute,
//    overlappable comm) + exposed comm. Synchronous collectives (the
//    default) are all exposed: each is waited for where it is issued.
//    With async_reduce the reductions (reduce-scatter, all-reduce, hybrid's
//    inter-node all-reduce) overlap backward but the last (the first forward
//    unit's); with async_gather the prefetched gathers overlap compute:
//    backward's but the first backward unit's (the last forward unit's),
//    forward's but the first unit's only with prefetch >= 2 (forward
//    prefetches prefetch - 1 units). After the step, zero1's param
//    all-gather is exposed. With one unit (wrap=none) everything is exposed,
//    as it really is.
//  - A strategy's hooks (PyTorch's FSDP and DDP on a calibrated profile:
//    forward_hooks_s, backward_hooks_s): measured whole, collectives'
//    fixed costs included, and added to each phase's compute: they run
//    on the compute thread.
//  - Offload (fully exposed, a conservative simplification): host→device copy
//    of the rank's fp32 param shard once per gather pass (zero3/hybrid: 2,
//    zero1/zero2: 1) and device→host copy of its fp32 grad shard, over the
//    host link; the optimizer then runs on the CPU.
//  - Optimizer: bytes touched (fp32 param read+write, grad read, each state
//    read+write) over the rank's optimizer shard / (memory bandwidth ×
//    efficiency), on the device, or on the host under offload; plus, on a
//    calibrated profile, its dispatch: measured whole for PyTorch's AdamW
//    (optimizer_dispatch_s), else one op_overhead_s per op it runs.
//
// step_time_s = forward phase + backward phase + optimizer_s + offload_s +
// post-step comm. tokens_per_s = batch × seq_len × world / step_time_s:
// global tokens per second.
//
// Gradient accumulation (k micro-batches per step): forward and backward
// phases k times, one optimizer step. zero2/zero3/hybrid gather and
// reduce-scatter (and, offloaded, copy) on every micro-batch; ddp/zero1
// all-reduce on the last one only (DDP's no_sync), so their other k−1
// backward phases are pure compute. tokens_per_s counts all k micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/candidate.h"
#include "planner/profile.h"
#include "spec/schedule.h"
#include "spec/strategy.h"

namespace shardfit::planner {

struct StepTimeInputs {
  Candidate candidate;        // sharding, offload, precision (wrap and ckpt
                              // act through the two fields below)
  double forward_flops = 0;   // one micro-batch on one rank at `batch`
  double backward_flops = 0;  // including recompute under +ckpt
  // The same work by op (ModelTrace::forward_work), for a profile with
  // measured kernels; empty: FLOPs alone.
  PhaseWork forward_work, backward_work;
  // Each unit's flat parameter numel, padded as the layout pads it for the
  // shard group, in forward execution order. Their sum is the whole model.
  std::vector<int64_t> unit_padded_numel;
  // ddp/zero1: DDP's gradient buckets' numel, in the order they are reduced
  // (spec/grad_buckets.h); empty: one all-reduce per unit.
  std::vector<int64_t> grad_bucket_numel;
  int64_t batch = 1;  // sequences per rank per micro-batch
  int64_t seq_len = 1;
  int grad_accum = 1;  // micro-batches per optimizer step
  int world_size = 1;        // all ranks
  int shard_group_size = 1;  // ranks a unit is sharded over (zero*: world,
                             // hybrid: GPUs per node, ddp: ignored)
  int nodes = 1;
  int optimizer_states = 2;  // fp32 states per param: AdamW 2, SGD 0
  // The ops one optimizer step dispatches on this rank (PyTorch's stack:
  // adamw_step_ops over the parameters its optimizer holds), each paying a
  // profile's measured op_overhead_s; 0 (the engine's few flat tensors):
  // the step is its bytes alone.
  int64_t optimizer_ops = 0;
  // zero1: the collectives that share the updated parameters after the
  // step, each paying the link's latency: PyTorch's ZeroRedundancyOptimizer
  // broadcasts every parameter from the rank that stepped it (_sync_params,
  // without parameters_as_bucket_view), so one a parameter; 0: one a unit.
  int64_t post_step_collectives = 0;
  // What each of those collectives costs beside its bytes, measured as
  // PyTorch issues them (MeasuredKernels::broadcast_s); 0: the link's
  // latency.
  double post_step_collective_s = 0;
  // The optimizer step's dispatch measured whole on this machine
  // (MeasuredKernels::adamw_steps' line at the tensors it steps and their
  // shapes); > 0 replaces optimizer_ops × op_overhead_s.
  double optimizer_dispatch_s = 0;
  // The strategy's own work on the compute thread in one micro-batch's
  // forward and in a backward that reduces, its collectives' fixed costs
  // included: PyTorch's FSDP hooks or DDP's as calibrate measured them on
  // this machine (MeasuredKernels::fsdp_hooks, ddp_hooks, at the job's
  // units or buckets and parameters). Added to the phases' compute (the
  // backward's on each micro-batch that reduces: every one for zero2,
  // zero3 and hybrid; the last for ddp and zero1, the others running under
  // no_sync); when either is > 0 the collectives pay their bytes alone,
  // not the link's latency too.
  double forward_hooks_s = 0;
  double backward_hooks_s = 0;
  // What a gradient reduction moves per element when not the compute
  // dtype's (0): 4 for ddp/zero1 under PyTorch's autocast (AMP: the
  // parameters, so their gradients and DDP's all-reduce, stay fp32); FSDP's
  // reduce_dtype's (its reduce-scatter and HSDP's all-reduce; the gathers
  // stay in the compute dtype).
  int reduce_elem_bytes = 0;
  // shardfit's engine on CPU ranks: c10d 1.13's Gloo has no reduce-scatter
  // and the engine gathers through an all-reduce too (executor/comm.cc), so
  // both move an all-reduce's bytes, 2(n−1)/n·M.
  bool gathers_via_all_reduce = false;
  // The schedule's overlap (--prefetch, --async-reduce, --async-gather):
  // what the engine runs beside compute.
  spec::ScheduleOptions schedule;
};

struct StepTime {
  double step_time_s = 0;
  double tokens_per_s = 0;  // global: batch × grad_accum × seq_len × world / step_time_s
  // The parts, for the report. compute_s and comm_s are totals, before
  // overlap; exposed_comm_s is the share of comm_s that adds to the step.
  double compute_s = 0;
  double forward_compute_s = 0;
  double backward_compute_s = 0;
  double comm_s = 0;
  double exposed_comm_s = 0;
  double offload_s = 0;    // host<->device copies
  double optimizer_s = 0;  // on the device, or on the CPU under offload
  // Bytes this rank sends per step, by link.
  double intra_node_comm_bytes = 0;
  double inter_node_comm_bytes = 0;
  double host_link_bytes = 0;
};

// Throws std::invalid_argument (one line) on inconsistent inputs: no units,
// batch or sizes < 1, world not a multiple of the shard group, a precision
// the profile lacks.
StepTime estimate_step_time(const StepTimeInputs& in, const DeviceProfile& profile);

// Bytes one rank sends in a ring collective of `bytes` over `ranks` ranks.
double all_gather_bytes_per_rank(double bytes, int ranks);      // (n−1)/n·M
double reduce_scatter_bytes_per_rank(double bytes, int ranks);  // (n−1)/n·M
double all_reduce_bytes_per_rank(double bytes, int ranks);      // 2(n−1)/n·M

}  // namespace shardfit::planner
