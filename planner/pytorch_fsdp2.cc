#include "planner/pytorch_fsdp2.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "planner/pytorch_fsdp.h"
#include "planner/pytorch_ledger.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {
namespace {

// One FSDPParamGroup (one fully_shard call) on rank 0: its ledger ids.
struct Group {
  std::vector<int64_t> shard;  // each parameter's padded shard, elements
  int64_t shard_sum = 0;       // the all-gather input's numel (Σ shard)
  std::vector<int64_t> outputs;  // each parameter's all_gather_outputs, while unsharded
  bool unsharded = false;
  bool gathering = false;   // unshard() called, wait_for_unshard() not yet (_all_gather_result)
  int64_t pending = -1;     // that all-gather's flat output
  int64_t grad_flat = -1;   // the reduce-scatter output the sharded .grads are views of
  int64_t all_reduce_state = -1;  // HSDP: the all-reduced output, held until the backward is finalized
  bool has_grads = false;   // the sharded parameters' .grad is set
  int post_forward_index = -1;
  bool pre_backward_done = false, post_backward_done = false;
};

// What ProcessGroupGloo allocates itself on CPU ranks, read in the meter's
// allocation log of real 2.11 jobs (pytorch/validate.py --log-allocations):
//
// dist.all_gather_into_tensor (_allgather_base): a tensor of the output's
// size made and dropped on the calling thread before the work runs, then
// the work's own flat output (AsyncAllgatherWork: newLikeFlat of the
// output's chunks) made on Gloo's worker thread and dropped once copied
// into the output. One after the other: one transient of the output's
// bytes beside FSDP2's all-gather output.
bool gloo_all_gather(Ledger& ledger, int64_t output_bytes, const std::string& label) {
  const int64_t flat = ledger.alloc(Category::kCommBuffers, output_bytes, label);
  if (flat < 0) return false;
  ledger.free(flat);
  return true;
}

// dist.reduce_scatter_tensor (_reduce_scatter_base ->
// reduce_scatter_tensor_coalesced): the input cloned on the calling thread
// (`buffers.push_back(inputTensors[i].clone())`) and all-reduced, the
// output copied from the clone's chunk; while the clone lives the worker
// thread makes and drops an 8-byte and a 4-byte tensor (ReduceOp.AVG's
// in-place division by the world size: the divisor wrapped as a 0-dim
// int64 tensor and its fp32 cast, as any CPU division by a Python number
// makes them). The clone goes when the work does; Gloo's worker thread
// sometimes holds the all-reduce's work, and with it the clone, longer
// (docs/pytorch-stack.md, "Late frees"): the plan is the program order.
bool gloo_reduce_scatter(Ledger& ledger, int64_t input_bytes, const std::string& label) {
  const int64_t clone = ledger.alloc(Category::kCommBuffers, input_bytes, label);
  if (clone < 0) return false;
  const int64_t divisor = ledger.alloc(Category::kTemporaries, 8, label);
  if (divisor < 0) return false;
  const int64_t cast = ledger.alloc(Category::kTemporaries, 4, label);
  if (cast < 0) return false;
  ledger.free(cast);
  ledger.free(divisor);
  ledger.free(clone);
  return true;
}

}  // namespace

int64_t fsdp2_shard_numel(const ParamInfo& p, int world) {
  const int64_t dim0 = p.shape.empty() ? p.numel : p.shape[0];
  if (dim0 <= 0) return 0;
  return (dim0 + world - 1) / world * (p.numel / dim0);
}

StepSimResult simulate_pytorch_fsdp2(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                     const PytorchFsdp2Options& o, AllocatorModel& allocator) {
  if (!in.no_grads || !in.optimizer_param_steps || in.param_numels.empty() ||
      in.optimizer_param_steps->size() != 2 * in.param_numels.size())
    throw std::invalid_argument("--stack pytorch FSDP2: the trace file lacks the no-grads traces or each parameter's "
                                "optimizer steps: record it again with pytorch/trace_recorder.py");
  if (o.world_size < 1) throw std::invalid_argument("world size must be at least 1");
  if (o.steps < 1) throw std::invalid_argument("steps must be at least 1");
  const int W = o.world_size;
  const bool mixed = o.mixed_precision != DType::kF32;
  // What is gathered and computed with: param_dtype's element; what is
  // reduced: reduce_dtype's (param_dtype's unless fp32 is asked for).
  const int64_t low = dtype_bytes(o.mixed_precision);
  const int64_t reduce = dtype_bytes(o.reduce_dtype.value_or(o.mixed_precision));
  // A world of one copies each shard into an fp32 `empty_like` of it
  // (_fsdp_param_group.py wait_for_unshard), so the model would compute in
  // fp32, not what a low-precision trace recorded.
  if (mixed && W == 1)
    throw std::invalid_argument("--stack pytorch FSDP2: MixedPrecisionPolicy on one GPU is not simulated in this "
                                "version");
  StepSimResult out;
  Ledger ledger(allocator, &out);

  // The groups: fully_shard on each block, then on the root, which manages
  // what no block does. A tied parameter belongs to one group
  // (_fsdp_state.py _validate_no_duplicate_params refuses it in two).
  const spec::UnitPartition part =
      spec::wrap_modules(modules, spec::WrapPolicy::parse(o.wrap_blocks ? "block" : "none"),
                         spec::TiedParams::kKeepTogether);
  std::vector<Group> groups(part.units.size());
  // The blocks (every group but the root's), in module order: the lists
  // explicit prefetching names.
  std::vector<int> blocks;
  for (size_t g = 0; g < part.units.size(); ++g)
    if (part.units[g].root_module != 0) blocks.push_back(static_cast<int>(g));
  auto block_index = [&](int gi) {
    const auto it = std::find(blocks.begin(), blocks.end(), gi);
    return it == blocks.end() ? -1 : static_cast<int>(it - blocks.begin());
  };
  for (size_t g = 0; g < groups.size(); ++g)
    for (const ParamInfo& p : part.units[g].params) {
      groups[g].shard.push_back(fsdp2_shard_numel(p, W));
      groups[g].shard_sum += groups[g].shard.back();
    }

  // AdamW over the sharded parameters in parameters() order (the module
  // table's): each parameter's state is its local shard's size
  // (zeros_like of the DTensor), rank 0's the padded one.
  std::vector<int64_t> shards;
  for (const ModuleNode& m : modules)
    for (const ParamInfo& p : m.params) shards.push_back(fsdp2_shard_numel(p, W));
  if (shards.size() != in.param_numels.size())
    throw std::invalid_argument("--stack pytorch FSDP2: the trace file's module table has " +
                                std::to_string(shards.size()) + " parameters and its optimizer steps " +
                                std::to_string(in.param_numels.size()));
  const ShardedAdamw adamw = sharded_adamw_steps(in, shards);

  // Init: what exists before the model (the cuBLAS workspaces), the buffers
  // (MixedPrecisionPolicy casts none), each parameter's padded shard, fp32,
  // its own allocation (_fsdp_param.py _init_sharded_param: new_zeros of the
  // padded size; pinned host memory under CPUOffloadPolicy). On CUDA the
  // unsharded originals fully_shard frees are not simulated: the caching
  // allocator gives them back on its first retry. On a CPU every byte
  // counts: the model is built whole (each parameter its own tensor), then
  // fully_shard, in the order it is called (each block, then the root),
  // makes each of its group's shards and, as it returns, drops the group's
  // originals (_init_sharded_param's `_setattr_on_modules`: "Let `param_data`
  // be freed normally when its ref count reaches 0 when the `fully_shard`
  // call returns").
  const std::string init = "init";
  for (int64_t b : o.overhead_bytes)
    if (ledger.alloc(Category::kOverhead, b, init) < 0) return out;
  std::vector<std::vector<int64_t>> originals(groups.size());
  if (o.cpu)
    for (size_t g = 0; g < groups.size(); ++g)
      for (const ParamInfo& p : part.units[g].params) {
        originals[g].push_back(ledger.alloc(Category::kParams, 4 * p.numel, init));
        if (originals[g].back() < 0) return out;
      }
  for (const auto& b : in.buffers)
    if (ledger.alloc(Category::kParams, b.bytes, init) < 0) return out;
  std::vector<int> shard_order = blocks;
  for (size_t g = 0; g < groups.size(); ++g)
    if (block_index(static_cast<int>(g)) < 0) shard_order.push_back(static_cast<int>(g));
  for (int g : shard_order) {
    if (!o.offload_params)
      for (int64_t s : groups[g].shard)
        if (ledger.alloc(Category::kParams, 4 * s, init) < 0) return out;
    ledger.free_all(originals[g]);
  }
  ledger.point(init);

  // FSDPCommContext: the last forward all-gather's output, kept until the
  // next group's copy-out (all_gather_state), and the last reduce-scatter's
  // input, kept until the next group's reduce (reduce_scatter_state).
  int64_t all_gather_state = -1, reduce_scatter_state = -1;
  std::vector<int> post_forward_order;
  std::vector<int64_t> outputs, previous_outputs;
  std::vector<std::vector<int64_t>> unit_grads(groups.size());
  std::vector<std::vector<std::pair<int, int64_t>>> grad_origins(groups.size());  // beside unit_grads
  for (int k = 1; k <= o.steps; ++k) {
    const std::string step = "step" + std::to_string(k);
    std::string label = step + "/forward";
    auto alloc = [&](Category c, int64_t bytes, int stream) { return ledger.alloc(c, bytes, label, stream); };
    // FSDPParamGroup.unshard -> _fsdp_collectives.py foreach_all_gather, on
    // the copy-in stream: the all-gather inputs (_get_param_all_gather_inputs:
    // under CPUOffloadPolicy each shard copied to the GPU, then cast to
    // param_dtype with a policy, the fp32 copy dropped; else with a policy one
    // flat param_dtype copy of every shard, the foreach-copy fast path; else
    // the shards themselves), the flat output of world x Σ shard elements
    // (all_gather_copy_in: the input is its own slice of it), the inputs
    // dropped once copied in. A world of one gathers nothing.
    auto unshard = [&](Group& g) {
      if (g.gathering || g.unsharded) return;
      g.gathering = true;
      if (W == 1) return;
      std::vector<int64_t> inputs;
      if (o.offload_params) {
        for (int64_t s : g.shard) {
          int64_t id = alloc(Category::kParams, 4 * s, kAllGatherCopyInStream);
          if (mixed) {
            const int64_t cast = alloc(Category::kParams, low * s, kAllGatherCopyInStream);
            ledger.free(id);
            id = cast;
          }
          inputs.push_back(id);
        }
      } else if (mixed) {
        inputs.push_back(alloc(Category::kCommBuffers, low * g.shard_sum, kAllGatherCopyInStream));
      }
      g.pending = alloc(Category::kCommBuffers, low * g.shard_sum * W, kAllGatherCopyInStream);
      if (o.cpu) gloo_all_gather(ledger, low * g.shard_sum * W, label);
      ledger.free_all(inputs);
    };
    // FSDPParamGroup.wait_for_unshard: in forward the previous group's flat
    // output (the implicit prefetch's deferred free) is released from
    // comm_ctx.all_gather_state first, but torch 2.11 binds it to a local
    // (`if prev_all_gather_state := self.comm_ctx.all_gather_state`), which
    // holds it until wait_for_unshard returns: past the copy-out (the
    // meter's log; the peak when the next all-gather was prefetched before
    // this forward). Each parameter's all_gather_outputs (world x its shard,
    // param_dtype) made on the compute stream and copied out into
    // (foreach_all_gather_copy_out); then this flat output kept as
    // all_gather_state in forward, freed at once in backward. A world of one
    // copies each shard (empty_like, fp32).
    auto wait_for_unshard = [&](Group& g, bool forward) {
      if (!g.gathering) return;
      g.gathering = false;
      const int64_t previous = forward ? all_gather_state : -1;
      if (forward) all_gather_state = -1;
      for (int64_t s : g.shard) g.outputs.push_back(alloc(Category::kParams, low * s * W, kFsdp2ComputeStream));
      ledger.free(previous);
      g.unsharded = true;
      if (W > 1 && forward) {
        all_gather_state = g.pending;
      } else {
        ledger.free(g.pending);
      }
      g.pending = -1;
    };
    auto reshard = [&](Group& g) {  // FSDPParam.to_sharded: free_storage of each all_gather_output
      ledger.free_all(g.outputs);
      g.unsharded = false;
    };
    // FSDPParamGroup.post_backward: the group resharded, then foreach_reduce
    // (after the previous reduce-scatter's input is dropped): its input of
    // world x Σ shard elements in reduce_dtype on the compute stream, the
    // unsharded gradients copied in (chunk_cat, which widens bf16 into an
    // fp32 input itself: no temporary) and freed; the
    // output, Σ shard, on the reduce-scatter stream, cast to fp32 there
    // when reduced in low precision (_to_dtype_if_needed; the low-precision
    // one dropped);
    // each parameter's sharded .grad a view of it (as_strided), or added into
    // the .grad kept from the last step (then it goes), or under
    // CPUOffloadPolicy copied to the host (it goes too). The input is kept as
    // reduce_scatter_state. With HSDP the output is all-reduced in place
    // across the replicas on the all-reduce stream and held
    // (_all_reduce_state, "to keep it alive until the end of backward")
    // until the group's backward is finalized; under a policy its fp32 cast
    // is made on that stream, the low-precision output kept beside it.
    // The id of group gi's last parameter's gradient (its fsdp_params are
    // its modules' parameters in named_parameters() order, as the unit's),
    // taken out of unit_grads[gi]: the last gradient the trace made in the
    // module owning that parameter, of its bytes. -1 when none is.
    auto take_last_param_grad = [&](int gi) -> int64_t {
      const spec::Unit& u = part.units[gi];
      int owner = -1;
      for (int m : u.modules)
        if (!modules[m].params.empty()) owner = m;
      if (owner < 0) return -1;
      const int64_t bytes = low * modules[owner].params.back().numel;
      for (size_t i = unit_grads[gi].size(); i-- > 0;)
        if (grad_origins[gi][i] == std::make_pair(owner, bytes)) {
          const int64_t id = unit_grads[gi][i];
          unit_grads[gi].erase(unit_grads[gi].begin() + static_cast<std::ptrdiff_t>(i));
          grad_origins[gi].erase(grad_origins[gi].begin() + static_cast<std::ptrdiff_t>(i));
          return id;
        }
      return -1;
    };
    auto post_backward = [&](int gi) {
      Group& g = groups[gi];
      if (g.post_backward_done) return;
      g.post_backward_done = true;
      reshard(g);
      if (unit_grads[gi].empty()) return;
      ledger.free(reduce_scatter_state);
      const int64_t input = alloc(Category::kCommBuffers, reduce * g.shard_sum * W, kFsdp2ComputeStream);
      // foreach_reduce's loop over zip(fsdp_params, unsharded_grads) (for
      // Shard(i > 0), run whenever world_size > 1) leaves its variable
      // `unsharded_grad` bound to the group's last gradient, so
      // `unsharded_grads.clear()` frees every gradient but that one, which
      // goes when foreach_reduce returns (_fsdp_collectives.py).
      const int64_t last_grad = W > 1 ? take_last_param_grad(gi) : -1;
      ledger.free_all(unit_grads[gi]);  // and clears the list
      grad_origins[gi].clear();
      int64_t reduced = alloc(Category::kGrads, reduce * g.shard_sum, kReduceScatterStream);
      if (o.cpu) gloo_reduce_scatter(ledger, reduce * g.shard_sum * W, label);
      if (o.hsdp) {
        g.all_reduce_state = reduced;
        if (reduce != 4) reduced = alloc(Category::kGrads, 4 * g.shard_sum, kAllReduceStream);
      } else if (reduce != 4) {
        const int64_t fp32 = alloc(Category::kGrads, 4 * g.shard_sum, kReduceScatterStream);
        ledger.free(reduced);
        reduced = fp32;
      }
      if (o.offload_params || g.has_grads) {
        if (reduced != g.all_reduce_state) ledger.free(reduced);
      } else {
        g.grad_flat = reduced;
      }
      g.has_grads = true;
      reduce_scatter_state = input;
      ledger.free(last_grad);
    };

    // opt.zero_grad(): set_to_none drops every sharded .grad, and with the
    // last view the flat output; else each is zeroed in place and stays.
    for (Group& g : groups) {
      if (o.zero_grad_set_to_none) {
        ledger.free(g.grad_flat);
        g.grad_flat = -1;
        g.has_grads = false;
      }
      g.pre_backward_done = g.post_backward_done = false;
    }
    FsdpStepHooks hooks;
    hooks.pre_forward = [&](int gi) {  // FSDPParamGroup.pre_forward
      unshard(groups[gi]);
      wait_for_unshard(groups[gi], true);
      // FSDPState._pre_forward, then: _prefetch_unshard(..., "forward") of
      // each module set_modules_to_forward_prefetch named (the example's
      // lists stop where the blocks do).
      const int b = block_index(gi);
      if (b >= 0 && b + o.forward_prefetch < static_cast<int>(blocks.size()))
        for (int j = 1; j <= o.forward_prefetch; ++j) unshard(groups[blocks[b + j]]);
    };
    hooks.post_forward = [&](int gi) {
      // FSDPParamGroup.post_forward: reshard (the root only when asked:
      // reshard_root_after_forward), then the
      // post-forward order recorded; the root's (_fsdp_state.py
      // _post_forward) frees the last all-gather's output.
      if (o.reshard_after_forward && (gi != 0 || o.reshard_root_after_forward)) reshard(groups[gi]);
      groups[gi].post_forward_index = static_cast<int>(post_forward_order.size());
      post_forward_order.push_back(gi);
      if (gi == 0) {
        ledger.free(all_gather_state);
        all_gather_state = -1;
      }
    };
    // FSDPParamGroup.pre_backward: unshard unless prefetched, wait, then
    // prefetch (_backward_prefetch) the group whose forward ended just
    // before this one's.
    hooks.pre_backward = [&](int gi) {
      Group& g = groups[gi];
      if (g.pre_backward_done) return;
      g.pre_backward_done = true;
      unshard(g);
      wait_for_unshard(g, false);
      // _pre_backward: an explicit list (set_modules_to_backward_prefetch)
      // replaces the implicit prefetch (default_prefetch is False then).
      const int b = block_index(gi);
      if (o.backward_prefetch > 0 && b >= o.backward_prefetch) {
        for (int j = 1; j <= o.backward_prefetch; ++j) unshard(groups[blocks[b - j]]);
      } else if (g.post_forward_index > 0) {
        unshard(groups[post_forward_order[g.post_forward_index - 1]]);
      }
    };
    hooks.backward_begins = [&] {
      // scaler.scale(loss), first call (ShardedGradScaler, fp16): its scale
      // and growth tracker, then the scaled loss (in the trace).
      if (o.grad_scaler && k == 1 && !grad_scaler_init(ledger, label)) return;
      hooks.pre_backward(0);  // the root's hook on the loss
    };
    hooks.post_backward = post_backward;
    if (!walk_fsdp_step(*in.no_grads, part, {}, step, label, hooks, ledger, unit_grads, outputs, previous_outputs,
                        &grad_origins))
      return out;
    // _root_post_backward_final_callback: every group whose post-backward
    // did not run (the root's inputs need no gradient), in all_states order
    // (the root's first), each then finalized (finalize_backward: the
    // all-reduce state released, a prefetch no backward used dropped); then
    // the last reduce-scatter's input goes.
    for (size_t gi = 0; gi < groups.size() && !ledger.oom(); ++gi) {
      Group& g = groups[gi];
      post_backward(static_cast<int>(gi));
      if (g.all_reduce_state != g.grad_flat) ledger.free(g.all_reduce_state);
      g.all_reduce_state = -1;
      if (g.gathering) {
        ledger.free(g.pending);
        g.pending = -1;
        g.gathering = false;
      }
    }
    if (ledger.oom()) return out;
    ledger.free(reduce_scatter_state);
    reduce_scatter_state = -1;
    post_forward_order.clear();
    previous_outputs.swap(outputs);
    outputs.clear();
    ledger.point(step + "/backward");
    // opt.step(): AdamW over the sharded parameters (on the host under
    // CPUOffloadPolicy); under scaler.step(opt), unscaled first, and
    // scaler.update() after.
    int64_t found_inf_copy = -1;
    if (o.grad_scaler && !grad_scaler_unscale(ledger, step + "/optimizer", found_inf_copy, o.offload_params))
      return out;
    if (!o.offload_params && !replay(k == 1 ? adamw.first : adamw.later, ledger, step + "/optimizer", false,
                                     Category::kTemporaries, Category::kOptimizer, nullptr))
      return out;
    if (o.grad_scaler && !grad_scaler_update(ledger, step + "/optimizer", found_inf_copy, o.offload_params)) return out;
    ledger.point(step + "/optimizer");
  }
  ledger.finish();
  return out;
}

}  // namespace shardfit::planner
