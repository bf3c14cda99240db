// PyTorch's own stack's step time: what its candidates run, handed to the
// time model (planner/time_model.h) as PyTorch overlaps it.
#include "planner/pytorch_step_time.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "planner/pytorch_fsdp.h"
#include "planner/pytorch_fsdp2.h"

namespace shardfit::planner {

bool is_fsdp(const Candidate& c) {
  return c.sharding == Sharding::kZero2 || c.sharding == Sharding::kZero3 || c.sharding == Sharding::kHybrid ||
         fsdp_no_shard(c);
}

spec::UnitPartition fsdp_units(const std::vector<ModuleNode>& modules, const Candidate& c, int version) {
  return spec::wrap_modules(modules, WrapPolicy::parse(c.wrap),
                            version == 2 ? spec::TiedParams::kKeepTogether : spec::TiedParams::kCopiedPerUnit);
}

namespace {

// A hook line (MeasuredKernels::fsdp_hooks, ddp_hooks) at `groups` units or
// buckets and `params` parameters; 0 when not measured.
double hooks_at(const MeasuredKernels::HookLine* h, int64_t groups, int64_t params) {
  return h ? h->fixed_s + h->per_group_s * static_cast<double>(groups) + h->per_param_s * static_cast<double>(params)
           : 0.0;
}

}  // namespace

double adamw_dispatch_s(const DeviceProfile& profile, AdamwStep adamw, bool dtensors,
                        const std::vector<std::vector<int64_t>>& shapes) {
  const auto* line = profile.measured_kernels.adamw_step(adamw_step_name(adamw), dtensors ? "dtensor" : "tensor");
  if (!line) return 0.0;
  const std::set<std::vector<int64_t>> distinct(shapes.begin(), shapes.end());
  return line->fixed_s + line->per_tensor_s * static_cast<double>(shapes.size()) +
         line->per_shape_s * static_cast<double>(distinct.size());
}

// One step's time by the time model (planner/time_model.h) as PyTorch's own
// stack overlaps it, at `flops` (forward, backward) for `batch`. DDP
// launches each bucket's all-reduce once its last gradient is ready
// (reducer.cpp mark_variable_ready), beside the rest of backward: its
// "units" are the rebuilt buckets (ddp_bucket_bytes, made in the order the
// gradients come, the reverse of parameters(): reversed here, so that the
// last one reduced, with nothing left to hide behind, is the time model's
// first unit), their gradients fp32 (autocast casts inside the forward
// only). ZeroRedundancyOptimizer broadcasts the updated parameters after
// the step one by one (zero1's all-gather: a latency a parameter, or the
// broadcast calibrate measured, MeasuredKernels::broadcast_s). FSDP
// (1.13) reduce-scatters on its post-backward stream beside backward and,
// with BACKWARD_PRE or BACKWARD_POST, gathers the next unit ahead of its
// backward (prefetch 1); with forward_prefetch (FSDP1, --prefetch 2) the
// next unit ahead of its forward too, else the forward's gathers are waited
// for. FSDP's and DDP's hooks, collectives included, cost what calibrate
// measured (MeasuredKernels::fsdp_hooks, ddp_hooks). The optimizer's step
// pays its dispatch (`adamw`'s over the tensors it steps: measured whole,
// adamw_dispatch_s, or one dispatch per op, adamw_step_ops).
StepTime pytorch_step_time(const Candidate& c, const PlanRequest& r, const TraceFile& file, int world,
                           const AffineTrace& trace, int64_t batch, AdamwStep adamw) {
  StepTimeInputs ti;
  ti.candidate = c;
  // FLOPs and op shapes are affine in the batch: the trace gives them at any batch.
  std::tie(ti.forward_flops, ti.backward_flops) = trace.flops_at(batch);
  std::tie(ti.forward_work, ti.backward_work) = trace.work_at(batch);
  ti.batch = batch;
  ti.seq_len = r.seq_len;
  ti.grad_accum = r.grad_accum;
  ti.world_size = world;
  // HSDP (FSDP2's hybrid) shards within a node.
  const int shard_world = c.sharding == Sharding::kHybrid ? r.gpus_per_node : world;
  ti.shard_group_size = shard_world;
  ti.nodes = r.nodes;
  ti.optimizer_states = 2;  // AdamW: exp_avg, exp_avg_sq
  // One rank's AdamW step over tensors of `shapes`: the step waits for the
  // rank whose step dispatches longest.
  auto charge_adamw = [&](const std::vector<std::vector<int64_t>>& shapes, bool dtensors) {
    ti.optimizer_ops = std::max(ti.optimizer_ops, adamw_step_ops(adamw, static_cast<int64_t>(shapes.size())));
    ti.optimizer_dispatch_s = std::max(ti.optimizer_dispatch_s, adamw_dispatch_s(r.profile, adamw, dtensors, shapes));
  };
  ti.schedule.async_reduce = true;
  if (is_fsdp(c)) {  // NO_SHARD: the time model's ddp, all-reducing each unit's gradient, gathering none
    ti.schedule.async_gather = r.fsdp_backward_prefetch != FsdpBackwardPrefetch::kNone;
    ti.schedule.prefetch = r.schedule.prefetch;  // 2: forward_prefetch (FSDP1)
    if (const auto d = parse_fsdp_reduce_dtype(r.fsdp_reduce_dtype))  // MixedPrecision(Policy)(reduce_dtype=d)
      ti.reduce_elem_bytes = static_cast<int>(dtype_bytes(*d));
    const spec::UnitPartition part = fsdp_units(file.modules, c, r.fsdp_version);
    // The tensors AdamW steps: FSDP1's flat parameters (or, with
    // use_orig_params, the parameters' parts of the busiest rank's shard),
    // FSDP2's DTensors.
    std::vector<std::vector<int64_t>> fsdp2_shapes;  // its DTensors' (global) shapes
    for (int rank = 0; r.fsdp_version == 1 && rank < (r.fsdp_use_orig_params ? world : 1); ++rank) {
      std::vector<std::vector<int64_t>> shapes;  // 1-D: flat shards, or views of one
      for (int64_t n : fsdp1_optimized_shards(file.modules, part, world, rank, fsdp_no_shard(c),
                                              r.fsdp_use_orig_params))
        if (n > 0) shapes.push_back({n});
      charge_adamw(shapes, false);
    }
    for (const auto& u : part.units) {
      // FSDP1: one flat parameter, padded unless NO_SHARD.
      int64_t padded = fsdp_no_shard(c) ? u.numel : fsdp_shard_numel(u.numel, world) * world;
      if (r.fsdp_version == 2) {                                  // FSDP2: each parameter on its own
        padded = 0;
        for (const ParamInfo& p : u.params) padded += fsdp2_shard_numel(p, shard_world) * shard_world;
        for (const ParamInfo& p : u.params) fsdp2_shapes.push_back(p.shape);
      }
      ti.unit_padded_numel.push_back(padded);
    }
    if (r.fsdp_version == 2) charge_adamw(fsdp2_shapes, true);
    // FSDP's hooks, as calibrate measured them: a group a unit holding
    // parameters (a flat parameter, a fully_shard group), a parameter one
    // of the model's. HSDP runs zero3's; NO_SHARD has none measured.
    int64_t groups = 0, params = 0;
    for (const auto& u : part.units) {
      groups += u.params.empty() ? 0 : 1;
      params += static_cast<int64_t>(u.params.size());
    }
    const std::string line = c.sharding == Sharding::kZero2 ? "zero2" : "zero3";
    auto hooks_s = [&](const char* phase) {
      return hooks_at(fsdp_no_shard(c) ? nullptr : r.profile.measured_kernels.fsdp_hook(r.fsdp_version, line, phase),
                      groups, params);
    };
    ti.forward_hooks_s = hooks_s("forward");
    ti.backward_hooks_s = hooks_s("backward");
  } else {
    ti.reduce_elem_bytes = 4;
    if (r.single_gpu_unwrapped) {
      ti.unit_padded_numel.push_back(file.param_count());  // no DDP: nothing reduced
    } else {
      const std::vector<int64_t> buckets = ddp_bucket_bytes(file.param_numels(), r.schedule.ddp_bucket_cap_bytes);
      for (auto b = buckets.rbegin(); b != buckets.rend(); ++b) ti.unit_padded_numel.push_back(*b / 4);
      // DDP's own work, as calibrate measured it: a bucket one of the
      // Reducer's, a parameter one autograd hook; and, when the model has
      // buffers, their broadcast before each forward (broadcast_buffers).
      const std::string mode = r.ddp_bucket_view ? "view" : "copy";
      auto hooks_s = [&](const char* phase) {
        return hooks_at(r.profile.measured_kernels.ddp_hook(mode, phase), static_cast<int64_t>(buckets.size()),
                        static_cast<int64_t>(file.param_numels().size()));
      };
      const double buffers_s = file.buffers().empty() ? 0.0 : r.profile.measured_kernels.ddp_buffers_s;
      ti.forward_hooks_s = hooks_s("forward") + buffers_s;
      ti.backward_hooks_s = hooks_s("backward");
    }
    // AdamW over every parameter, or ZeroRedundancyOptimizer's local one
    // over each rank's partition (the step waits for the slowest).
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& m : file.modules)
      for (const ParamInfo& p : m.params) shapes.push_back(p.shape);
    std::vector<std::vector<int>> ranks = {std::vector<int>(shapes.size())};
    std::iota(ranks[0].begin(), ranks[0].end(), 0);
    if (c.sharding == Sharding::kZero1) {
      // _sync_params: a broadcast of each parameter from the rank that owns it.
      ti.post_step_collectives = static_cast<int64_t>(shapes.size());
      ti.post_step_collective_s = r.profile.measured_kernels.broadcast_s;  // as Python issues them, where measured
      ranks = zero_redundancy_partition(file.param_numels(), world);
    }
    for (const std::vector<int>& params : ranks) {
      std::vector<std::vector<int64_t>> stepped;
      for (int i : params) stepped.push_back(shapes[i]);
      charge_adamw(stepped, false);
    }
  }
  return estimate_step_time(ti, r.profile);
}

}  // namespace shardfit::planner
