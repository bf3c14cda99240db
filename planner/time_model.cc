#include "planner/time_model.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace shardfit::planner {
namespace {

// fp32 master weights, gradients handed to the optimizer and optimizer
// states are 4 bytes per element whatever the compute precision.
constexpr double kMasterBytes = 4;

// Overlappable and exposed communication of one phase, in seconds.
struct PhaseComm {
  double overlappable_s = 0;
  double exposed_s = 0;
  double total_s() const { return overlappable_s + exposed_s; }
};

double phase_time(double compute_s, const PhaseComm& comm) {
  return std::max(compute_s, comm.overlappable_s) + comm.exposed_s;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("time model: " + what);
}

}  // namespace

double all_gather_bytes_per_rank(double bytes, int ranks) {
  return ranks <= 1 ? 0.0 : bytes * (ranks - 1) / ranks;
}

double reduce_scatter_bytes_per_rank(double bytes, int ranks) {
  return all_gather_bytes_per_rank(bytes, ranks);
}

double all_reduce_bytes_per_rank(double bytes, int ranks) {
  return 2 * all_gather_bytes_per_rank(bytes, ranks);
}

// A step's collectives as the schedule runs them: what each phase moves and
// how much of it can hide behind compute, what follows the optimizer step,
// and how the optimizer's work is shared.
struct StepComm {
  PhaseComm fwd, bwd;
  double post_step_s = 0;         // zero1's all-gather of the updated params
  int optimizer_shard_ranks = 1;  // the optimizer updates model / this many
  int gather_passes = 0;          // param gathers per step (for offload copies)
  double intra_node_bytes = 0, inter_node_bytes = 0;  // per rank, one micro-batch's reductions
};

StepComm step_comm(const StepTimeInputs& in, const DeviceProfile& profile, const spec::StrategyTraits& traits,
                   double elem_bytes, double model_numel) {
  StepComm x;
  // Backward finishes with the first forward unit: its reduction is the one
  // nothing is left to hide behind; forward starts with its gather.
  const double first_unit_numel = static_cast<double>(in.unit_padded_numel.front());
  const double last_unit_numel = static_cast<double>(in.unit_padded_numel.back());
  const int n = in.world_size;
  const double collective_eff = profile.efficiency.collective;
  const double intra_per_s = profile.gpu_link.bytes_per_s * collective_eff;
  const double inter_per_s = profile.inter_node_link.bytes_per_s * collective_eff;
  // A ring over ranks on several nodes crosses the inter-node link, and runs
  // at its slowest hop.
  const double world_ring_per_s = in.nodes > 1 ? std::min(intra_per_s, inter_per_s) : intra_per_s;
  // Each collective's fixed cost, where the profile measured one (0 otherwise);
  // one rank alone calls none.
  const double latency_s = n > 1 ? profile.gpu_link.latency_s : 0.0;
  // Measured hooks include each collective's fixed cost.
  const bool hooks_measured = in.forward_hooks_s > 0 || in.backward_hooks_s > 0;
  const double collective_latency_s = hooks_measured ? 0.0 : latency_s;
  const double units = static_cast<double>(in.unit_padded_numel.size());
  // Gathers and reduce-scatters done as all-reduces move twice the bytes.
  const double gather_factor = in.gathers_via_all_reduce ? 2.0 : 1.0;

  // What the schedule overlaps (spec/schedule.h): a reduction runs beside
  // the rest of backward only with async_reduce; a gather beside compute
  // only when a prefetch launched it with async_gather (backward prefetches
  // `prefetch` units, forward prefetch - 1). Otherwise each collective is
  // waited for where it is issued and adds its whole time to the step.
  const bool hide_reductions = in.schedule.async_reduce;
  const bool hide_backward_gathers = in.schedule.async_gather;  // backward prefetches prefetch >= 1 units
  const bool hide_forward_gathers = in.schedule.async_gather && in.schedule.prefetch >= 2;
  // `total` of which all but `last` can hide behind compute when `hide`.
  auto split = [](double total_s, double last_s, bool hide) {
    return hide ? PhaseComm{total_s - last_s, last_s} : PhaseComm{0, total_s};
  };
  auto add = [](PhaseComm a, const PhaseComm& b) {
    a.overlappable_s += b.overlappable_s;
    a.exposed_s += b.exposed_s;
    return a;
  };

  // What a gradient reduction moves per element: the compute dtype's, or
  // reduce_elem_bytes.
  const double grad_elem_bytes = in.reduce_elem_bytes > 0 ? in.reduce_elem_bytes : elem_bytes;
  if (!traits.shard_grads) {
    // ddp, zero1: the flat grad all-reduced bucket by bucket as backward
    // fills them; the last bucket has nothing left to hide behind. (No
    // buckets given: one per unit, the first forward unit's last.)
    const bool by_bucket = !in.grad_bucket_numel.empty();
    const double reductions = by_bucket ? static_cast<double>(in.grad_bucket_numel.size()) : units;
    const double last_numel = by_bucket ? static_cast<double>(in.grad_bucket_numel.back()) : first_unit_numel;
    const double grad_bytes = model_numel * grad_elem_bytes;
    const double total_s =
        all_reduce_bytes_per_rank(grad_bytes, n) / world_ring_per_s + reductions * collective_latency_s;
    const double last_s =
        all_reduce_bytes_per_rank(last_numel * grad_elem_bytes, n) / world_ring_per_s + collective_latency_s;
    x.bwd = split(total_s, last_s, hide_reductions);
    x.intra_node_bytes = all_reduce_bytes_per_rank(grad_bytes, n);
    if (traits.all_gather_params_after_step()) {
      // zero1: every rank updated a shard of the fp32 params; all ranks need all.
      const double param_bytes = model_numel * kMasterBytes;
      const double gathers = in.post_step_collectives > 0 ? static_cast<double>(in.post_step_collectives) : units;
      const double each_s = in.post_step_collective_s > 0 && n > 1 ? in.post_step_collective_s : latency_s;
      x.post_step_s =
          gather_factor * all_gather_bytes_per_rank(param_bytes, n) / world_ring_per_s + gathers * each_s;
      x.intra_node_bytes += gather_factor * all_gather_bytes_per_rank(param_bytes, n);
      x.optimizer_shard_ranks = n;
      x.gather_passes = 1;
    }
  } else {
    // zero2, zero3, hybrid: gathers per unit, reduce-scatters of grads.
    const bool hybrid = traits.replicate_across_groups;
    const int g = traits.shard_group_size;
    check(!hybrid || g * in.nodes == n, "hybrid needs shard_group_size x nodes = world_size (" +
                                            std::to_string(g) + " x " + std::to_string(in.nodes) +
                                            " != " + std::to_string(n) + ")");
    // Hybrid's shard group is one node: its ring never leaves the node.
    const double ring_per_s = hybrid ? intra_per_s : world_ring_per_s;
    // One gather (`bytes` = elem_bytes) or reduce-scatter (grad_elem_bytes)
    // pass over `numel` in `collectives` calls.
    auto ring_s = [&](double numel, double collectives, double bytes) {
      return gather_factor * all_gather_bytes_per_rank(numel * bytes, g) / ring_per_s +
             collectives * collective_latency_s;
    };
    // Forward: nothing runs before the first unit's gather.
    x.fwd = split(ring_s(model_numel, units, elem_bytes), ring_s(first_unit_numel, 1, elem_bytes),
                hide_forward_gathers);
    const bool regather = traits.reshard_after_forward;  // zero2 keeps params for backward
    const int backward_collectives = regather ? 2 : 1;   // (AG +) RS
    // Backward: the last reduce-scatter (the first forward unit's) and, when
    // params are re-gathered, the first backward unit's gather (the last
    // forward unit's) have nothing to hide behind.
    x.bwd = split(ring_s(model_numel, units, grad_elem_bytes), ring_s(first_unit_numel, 1, grad_elem_bytes),
                hide_reductions);
    if (regather)
      x.bwd = add(x.bwd, split(ring_s(model_numel, units, elem_bytes), ring_s(last_unit_numel, 1, elem_bytes),
                           hide_backward_gathers));
    x.intra_node_bytes =
        gather_factor * (backward_collectives * all_gather_bytes_per_rank(model_numel * elem_bytes, g) +
                         all_gather_bytes_per_rank(model_numel * grad_elem_bytes, g));
    if (hybrid && in.nodes > 1) {
      // Replicas average their shard of the grads across nodes, unit by
      // unit after each reduce-scatter: overlappable except the last.
      auto inter_s = [&](double numel) {
        return all_reduce_bytes_per_rank(numel / g * grad_elem_bytes, in.nodes) / inter_per_s;
      };
      x.bwd = add(x.bwd, split(inter_s(model_numel), inter_s(first_unit_numel), hide_reductions));
      x.inter_node_bytes = all_reduce_bytes_per_rank(model_numel / g * grad_elem_bytes, in.nodes);
    }
    x.optimizer_shard_ranks = g;
    x.gather_passes = regather ? 2 : 1;
  }
  return x;
}

StepTime estimate_step_time(const StepTimeInputs& in, const DeviceProfile& profile) {
  const Candidate& c = in.candidate;
  check(!in.unit_padded_numel.empty(), "no units");
  check(in.batch >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
        "batch, seq_len and grad_accum must be >= 1");
  check(in.world_size >= 1 && in.nodes >= 1 && in.shard_group_size >= 1,
        "world_size, nodes and shard_group_size must be >= 1");
  check(in.world_size % in.nodes == 0, "world_size " + std::to_string(in.world_size) +
                                           " is not a multiple of nodes " +
                                           std::to_string(in.nodes));
  check(in.forward_flops >= 0 && in.backward_flops >= 0 && in.optimizer_states >= 0,
        "negative flops or optimizer states");
  // spec's validator: a shard group that does not fit the world, ddp+offload.
  const std::string problem = spec::strategy_problem(c, in.world_size, in.shard_group_size);
  check(problem.empty(), c.to_id() + ": " + problem);
  const spec::StrategyTraits traits =
      spec::decode_strategy(c, in.world_size, in.shard_group_size);
  const DType dtype = traits.compute_dtype;
  check(profile.supports(dtype),
        std::string(precision_name(c.precision)) + " is not supported by " + profile.name);

  StepTime t;
  // --- compute ---
  const double flops_per_s = profile.peak_flops_per_s(dtype) * profile.flops_efficiency(dtype);
  const MeasuredKernels& kernels = profile.measured_kernels;
  const bool by_op = kernels.times(dtype) && !in.forward_work.empty() && !in.backward_work.empty();
  auto phase_compute_s = [&](const PhaseWork& w, double flops) {
    if (!by_op) return flops / flops_per_s;
    double s = static_cast<double>(w.ops()) * kernels.op_overhead_s;
    for (const GemmShape& g : w.gemms) s += g.flops() / kernels.matmul_rate(dtype, g);
    const auto named = kernels.kernel_bytes_per_s.find(dtype);
    for (const KernelWork& kw : w.kernels) {
      double rate = profile.memory_bytes_per_s;
      if (named != kernels.kernel_bytes_per_s.end())
        if (auto it = named->second.find(kw.op); it != named->second.end()) rate = it->second;
      s += kw.bytes / rate;
    }
    return s;
  };
  const double k = in.grad_accum;  // micro-batches per step
  check(in.forward_hooks_s >= 0 && in.backward_hooks_s >= 0 && in.post_step_collective_s >= 0,
        "negative hook or collective time");
  // Micro-batches: sharded strategies communicate on each; ddp/zero1 reduce
  // once, after the last (their byte counts below are already per step),
  // and only that backward runs the reducing hooks.
  const bool reduce_every_micro = traits.reduce_every_micro_batch();
  const double comm_micro_batches = reduce_every_micro ? k : 1.0;
  const double micro_forward_s = phase_compute_s(in.forward_work, in.forward_flops) + in.forward_hooks_s;
  const double quiet_backward_s = phase_compute_s(in.backward_work, in.backward_flops);
  const double micro_backward_s = quiet_backward_s + in.backward_hooks_s;  // one that reduces
  t.forward_compute_s = k * micro_forward_s;
  t.backward_compute_s = k * quiet_backward_s + comm_micro_batches * in.backward_hooks_s;
  t.compute_s = t.forward_compute_s + t.backward_compute_s;

  // --- communication ---
  const double elem_bytes = static_cast<double>(dtype_bytes(dtype));
  const double model_numel = static_cast<double>(
      std::accumulate(in.unit_padded_numel.begin(), in.unit_padded_numel.end(), int64_t{0}));
  const StepComm comm = step_comm(in, profile, traits, elem_bytes, model_numel);
  const PhaseComm& fwd = comm.fwd;
  const PhaseComm& bwd = comm.bwd;
  const double post_step_comm_s = comm.post_step_s;
  t.intra_node_comm_bytes = comm.intra_node_bytes;
  t.inter_node_comm_bytes = comm.inter_node_bytes;
  if (reduce_every_micro) {
    t.intra_node_comm_bytes *= k;
    t.inter_node_comm_bytes *= k;
  }
  t.comm_s = k * fwd.total_s() + comm_micro_batches * bwd.total_s() + post_step_comm_s;

  // --- optimizer and offload ---
  const double shard_numel = model_numel / comm.optimizer_shard_ranks;
  // fp32 param read + write, grad read, each state read + write.
  const double optimizer_bytes = shard_numel * kMasterBytes * (3 + 2 * in.optimizer_states);
  if (traits.offload) {
    // Params in per gather pass, grads out once per reduction; zero1 gathers
    // once per step (after the update), the others on every micro-batch.
    const double copies = (comm.gather_passes + 1) * comm_micro_batches;
    t.host_link_bytes = copies * shard_numel * kMasterBytes;
    t.offload_s =
        t.host_link_bytes / (profile.host_link.bytes_per_s * profile.efficiency.host_link);
    t.optimizer_s =
        optimizer_bytes / (profile.host_memory_bytes_per_s * profile.efficiency.host_memory);
  } else {
    t.optimizer_s = optimizer_bytes / (profile.memory_bytes_per_s * profile.efficiency.memory);
  }
  if (in.optimizer_dispatch_s > 0) {
    t.optimizer_s += in.optimizer_dispatch_s;
  } else if (by_op) {
    t.optimizer_s += static_cast<double>(in.optimizer_ops) * kernels.op_overhead_s;
  }

  const double forward_s = k * phase_time(micro_forward_s, fwd);
  // The reducing backward phases, and (ddp/zero1) the compute-only others.
  const double backward_s = comm_micro_batches * phase_time(micro_backward_s, bwd) +
                            (k - comm_micro_batches) * quiet_backward_s;
  t.step_time_s = forward_s + backward_s + post_step_comm_s + t.optimizer_s + t.offload_s;
  t.exposed_comm_s = forward_s + backward_s + post_step_comm_s - t.compute_s;
  t.tokens_per_s = t.step_time_s > 0 ? static_cast<double>(in.batch) * k *
                                           static_cast<double>(in.seq_len) * in.world_size / t.step_time_s
                                     : 0.0;
  return t;
}

}  // namespace shardfit::planner
