#include "planner/pytorch_fsdp.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "planner/pytorch_ledger.h"
#include "spec/schedule.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {
namespace {

// One FSDP instance's FlatParameter on this rank: its ledger ids.
struct FlatParam {
  int64_t numel = 0, shard = 0;  // the sharded flat parameter stays allocated from init (on the GPU unless offloaded)
  int64_t unsharded = -1;    // the padded unsharded flat parameter, while gathered
  int64_t grad_shard = -1;   // .grad / _saved_grad_shard (the reduced shard; NO_SHARD: the whole gradient)
  DType grad_dtype = DType::kF32;  // grad_shard's (keep_low_precision_grads: param_dtype; NO_SHARD: reduce_dtype)
  bool needs_pre_forward = false, needs_pre_backward = false, prefetched = false, backward_done = false;
};

}  // namespace

namespace {

std::vector<int> units_pre_order(const spec::UnitPartition& part) {
  std::vector<int> order(part.units.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = static_cast<int>(u);
  return order;
}

// The reduced fp32 shard becomes the unit's .grad, or is added into the one
// kept from the last step (zero_grad(set_to_none=False)) and dropped.
void keep_grad_shard(Ledger& ledger, FlatParam& u, int64_t shard) {
  if (u.grad_shard >= 0) {
    ledger.free(shard);
    return;
  }
  u.grad_shard = shard;
  u.grad_dtype = DType::kF32;
}

// _get_gradient_predivide_factor: the smallest power of two f with W / f
// <= f (W divisible by it); the gradient is divided by it before the
// reduction and by W / f after.
int gradient_predivide_factor(int W) {
  int pre = 1;
  while (W % pre == 0 && W / pre > pre) pre *= 2;
  return pre;
}

// _div_if_needed on a CPU tensor: tensor.div_(factor) wraps the Python
// float as a 0-dim double and casts it to fp32, both dropped at once.
void cpu_divide(Ledger& ledger, const std::string& label, int stream) {
  const int64_t scalar = ledger.alloc(Category::kTemporaries, 8, label, stream);
  ledger.free(ledger.alloc(Category::kTemporaries, 4, label, stream));
  ledger.free(scalar);
}

// _post_backward_hook's reduction as torch 2.11 runs it on CPU ranks
// (sharded), after the flat gradient `flat` is made and the unit resharded:
// _runtime_utils.py _reduce_grad. With MixedPrecision `flat` is param_dtype,
// and unless that is reduce_dtype (`reduce` bytes an element),
// `flat_param.grad.data = flat_param.grad.to(reduce_dtype)` first makes the
// flat gradient in it (`cast_flat`; the param_dtype one held by the hook's
// autograd_computed_grad until it returns). _get_reduce_scatter_tensors pads
// it (F.pad, a copy) only when world x shard exceeds it, and makes the shard
// (empty_like(chunks[0])); _div_if_needed divides the input in place by the
// predivide factor (a Python float: a 0-dim double and its fp32 cast, 8 and
// 4 bytes, come and go); Gloo's reduce_scatter_tensor clones the input for
// the collective (made and dropped around it); the postdivide the same way
// on the shard when its factor is not 1; _cast_grad_to_param_dtype makes a
// shard that is not fp32 fp32 (`sharded_grad.data.to(param.dtype)`, the low
// one dropped). No record_stream on a CPU: the flat gradients go as the hook
// returns. The shard is kept as .grad, or added into the one kept from the
// last step and dropped.
void cpu_reduce_grad(Ledger& ledger, const std::string& label, int W, FlatParam& u, int64_t flat, int stream,
                     int64_t reduce, bool cast_flat) {
  auto alloc = [&](Category c, int64_t bytes) { return ledger.alloc(c, bytes, label, stream); };
  const int64_t cast = cast_flat ? alloc(Category::kGrads, reduce * u.numel) : -1;
  const int64_t padded = u.shard * W != u.numel ? alloc(Category::kCommBuffers, reduce * u.shard * W) : -1;
  int64_t shard = alloc(Category::kGrads, reduce * u.shard);
  const int pre = gradient_predivide_factor(W);
  if (pre > 1) cpu_divide(ledger, label, stream);
  ledger.free(alloc(Category::kCommBuffers, reduce * u.shard * W));  // Gloo's clone of the input
  if (W / pre > 1) cpu_divide(ledger, label, stream);
  if (reduce != 4) {
    const int64_t fp32 = alloc(Category::kGrads, 4 * u.shard);
    ledger.free(shard);
    shard = fp32;
  }
  keep_grad_shard(ledger, u, shard);
  ledger.free(padded);
  ledger.free(cast);
  ledger.free(flat);
}

// The units in the order _recursive_wrap wraps them: a unit after every unit
// nested in it (part.units is in pre-order, outer before inner).
std::vector<int> units_post_order(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part) {
  auto inside = [&](int module, int ancestor) {
    for (int m = module; m >= 0; m = modules[m].parent)
      if (m == ancestor) return true;
    return false;
  };
  std::vector<int> order, open;
  for (size_t u = 0; u < part.units.size(); ++u) {
    while (!open.empty() && !inside(part.units[u].root_module, part.units[open.back()].root_module)) {
      order.push_back(open.back());
      open.pop_back();
    }
    open.push_back(static_cast<int>(u));
  }
  order.insert(order.end(), open.rbegin(), open.rend());
  return order;
}

// One rank's FSDP job: the units' state across the steps, and each phase of
// the loop (init, then per step zero_grad, the forward and backward through
// the hooks, the backward's end, the optimizer step) as a method, in the
// order run() calls them.
class Fsdp1Job {
 public:
  Fsdp1Job(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules, const PytorchFsdpOptions& o,
           AllocatorModel& allocator);
  StepSimResult run();

 private:
  bool init();
  bool step(int k);
  void zero_grad();
  void drop_grads();  // every unit's .grad
  void cast_buffers();
  StepHooks hooks(int k);
  void run_hook(spec::Hook hook, int ui);
  void apply(spec::Op op, int ui, bool forward);
  void unshard(FlatParam& u);
  void reshard(FlatParam& u);
  void reshard_forward_copy(int ui);
  void prefetch(int u, bool forward);
  void post_backward(int ui);
  void no_shard_reduce(FlatParam& u, int64_t flat);
  void sharded_reduce(FlatParam& u, int64_t flat);
  void finalize_params();
  int64_t alloc(Category c, int64_t bytes, int stream) { return ledger_.alloc(c, bytes, label_, stream); }

  const PytorchDdpInputs& in_;
  const std::vector<ModuleNode>& modules_;
  const PytorchFsdpOptions& o_;
  const int W;
  // NO_SHARD, as a world of one runs (fully_sharded_data_parallel.py: "We
  // clamp the strategy to NO_SHARD for world size of 1"): each unit's flat
  // parameter whole and unpadded, never gathered; its gradient all-reduced in
  // place and kept as .grad. With MixedPrecision, `_mp_shard` is the whole
  // flat parameter in param_dtype, made by each pre_unshard and freed by each
  // post_reshard (flat_param.py: "For `NO_SHARD`, `_mp_shard` is not freed in
  // the post-unshard ... we delay the free until the reshard").
  const bool no_shard;
  // MixedPrecision: the element size of what FSDP gathers and computes with
  // (param_dtype), and of what it reduces (reduce_dtype: param_dtype's or
  // fp32's); 4 without it.
  const bool mixed;
  const int64_t low;
  // reduce_dtype: unless it is the gradients' own dtype, `param.grad.data =
  // param.grad.data.to(reduce_dtype)` makes a copy first; unless it is fp32,
  // _cast_grad_to_param_dtype casts what was reduced back to fp32.
  const DType reduce_dtype;
  const bool reduce_cast;
  const int64_t reduce;
  const bool casts;  // _mixed_precision_enabled_for_params() or ..._for_reduce()
  const bool keep_low_grads;
  StepSimResult out_;
  Ledger ledger_;
  spec::UnitPartition part_;
  std::optional<StepIndex> index_;  // the step's trace over part_
  spec::Schedule schedule_;  // which actions each hook takes (Runtime::kTorchFsdp1)
  int step_ = 0;             // the step running (forward prefetch waits for step 1's recorded order)
  std::vector<FlatParam> units_;
  std::vector<int64_t> forward_copy_;  // NO_SHARD + offload: see unshard
  SplitTieGrads split_ties_;
  ShardedAdamw adamw_;
  std::vector<int64_t> buffer_ids_;
  std::vector<int> forward_order_;  // units by pre-forward (_exec_order_data, first iteration)
  // Units by post-forward, the order backward prefetching reads
  // (_exec_order_utils.py get_handle_to_backward_prefetch: the handle before
  // this one in handles_post_forward_order): the root's forward ends last,
  // so its pre-backward prefetches the last block.
  std::vector<int> post_forward_order_;
  std::vector<int64_t> outputs_, previous_outputs_;
  std::vector<std::vector<int64_t>> unit_grads_;
  std::string label_;
  // The gradient of the flat parameter, freed with record_stream(post-
  // backward stream) (_post_backward_hook: orig_grad_data.record_stream):
  // the allocator may reuse its block only once the reduce-scatter queued
  // behind it is done; taken here as when the next unit's hook runs.
  int64_t in_flight_grad_ = -1;
  int64_t flat_grad_ = -1;  // the flat gradient of the unit whose post-backward runs
  bool orig_grads_dropped_ = false;  // use_orig_params: zero_grad dropped the views; see zero_grad
};

Fsdp1Job::Fsdp1Job(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules, const PytorchFsdpOptions& o,
                   AllocatorModel& allocator)
    : in_(in),
      modules_(modules),
      o_(o),
      W((check_fsdp_request(in, o.world_size, o.steps, "FSDP"), o.world_size)),
      no_shard(W == 1 || o.no_shard),
      mixed(o.mixed_precision != DType::kF32),
      low(dtype_bytes(o.mixed_precision)),
      reduce_dtype(o.reduce_dtype.value_or(o.mixed_precision)),
      reduce_cast(reduce_dtype != o.mixed_precision),
      reduce(dtype_bytes(reduce_dtype)),
      casts(mixed || o.reduce_dtype),
      keep_low_grads(mixed && o.keep_low_precision_grads),
      ledger_(allocator, &out_) {
  if (o.forward_prefetch && no_shard && o.offload_params && !mixed)
    throw std::invalid_argument("--stack pytorch FSDP: forward_prefetch (--prefetch 2) on one GPU with CPU offload "
                                "is not simulated in this version");
  // The units: _recursive_wrap with the auto wrap policy, the root wrapping
  // what remains; a tied weight copied into each unit holding a
  // registration of it (spec::TiedParams::kCopiedPerUnit).
  if (o.wrap.kind == spec::WrapPolicy::Kind::kNone)
    throw std::invalid_argument("--stack pytorch FSDP: wrap=none is not an auto wrap policy (wrap=size:N or block)");
  part_ = spec::wrap_modules(modules, o.wrap, spec::TiedParams::kCopiedPerUnit);
  index_.emplace(*in.no_grads, part_);
  // FULL_SHARD reshards after forward as zero3 does, SHARD_GRAD_OP keeps the
  // unit as zero2 does, NO_SHARD shards nothing, as ddp.
  spec::ScheduleOptions schedule;
  schedule.prefetch = o.forward_prefetch ? 2 : 1;  // forward_prefetch_limit and backward_prefetch_limit are 1
  schedule.runtime = spec::Runtime::kTorchFsdp1;
  schedule.backward_prefetch = o.backward_prefetch;
  schedule_ = pytorch_schedule(
      no_shard ? spec::Sharding::kDdp : o.reshard_after_forward ? spec::Sharding::kZero3 : spec::Sharding::kZero2,
      schedule);
  units_.resize(part_.units.size());
  forward_copy_.assign(part_.units.size(), -1);
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].numel = part_.units[u].numel;
    units_[u].shard = fsdp1_rank_numel(units_[u].numel, W, no_shard);
  }
  // A tie split across units: the owner's and the borrower's gradients are
  // each its own unit's (SplitTieGrads).
  split_ties_ = split_tie_grads(modules, part_, low);

  // use_orig_params=True with a tie split across units: PyTorch's FSDP1
  // gives the weight two flat parameters' views and fails in its forward
  // (torch 2.11 on CPU ranks: "size mismatch").
  if (o.use_orig_params && !split_ties_.borrowers.empty())
    throw std::invalid_argument("--fsdp-use-orig-params: a tied weight split across FSDP units (the wrap policy "
                                "puts its owner and a borrower apart), which PyTorch's FSDP1 cannot run with "
                                "use_orig_params=True; wrap=block keeps them together");
  adamw_ = sharded_adamw_steps(in, fsdp1_optimized_shards(modules, part_, W, o.rank, no_shard, o.use_orig_params));
  unit_grads_.resize(units_.size());
}

StepSimResult Fsdp1Job::run() {
  if (!init()) return out_;
  for (int k = 1; k <= o_.steps; ++k)
    if (!step(k)) return out_;
  ledger_.finish();
  return out_;
}

// Init: what exists before the model (the profile's cuBLAS workspaces),
// the buffers (moved to the GPU with the module), each unit's shard
// (flat_param.py _get_shard: the rank's chunk, padded, cloned), on the host
// with offload_params. On CUDA the construction's own transients (the
// whole module, each unit's unsharded FlatParameter before sharding) are
// not simulated: the caching allocator gives them back on its first retry.
// On a CPU they count: the model built whole (each module's parameters),
// then each unit as _recursive_wrap makes it (nested units first):
// flat_param.py flatten_tensors cats its parameters into one flat tensor,
// _get_shard clones the rank's padded chunk, the flat tensor is dropped
// and so are the module's original parameters (replaced by views).
bool Fsdp1Job::init() {
  const std::string init = "init";
  if (!alloc_each(ledger_, Category::kOverhead, o_.overhead_bytes, init)) return false;
  std::vector<int64_t> originals(modules_.size(), -1);
  if (o_.cpu)
    for (size_t m = 0; m < modules_.size(); ++m) {
      int64_t bytes = 0;
      for (const ParamInfo& p : modules_[m].params) bytes += 4 * p.numel;
      if (bytes > 0 && (originals[m] = ledger_.alloc(Category::kParams, bytes, init)) < 0) return false;
    }
  if (!alloc_each(ledger_, Category::kParams, buffer_bytes(in_.buffers), init, &buffer_ids_)) return false;
  for (int ui : o_.cpu ? units_post_order(modules_, part_) : units_pre_order(part_)) {
    const FlatParam& u = units_[ui];
    const int64_t flat = o_.cpu && u.numel > 0 ? ledger_.alloc(Category::kParams, 4 * u.numel, init) : -1;
    if (!o_.offload_params && u.numel > 0 && ledger_.alloc(Category::kParams, 4 * u.shard, init) < 0) return false;
    ledger_.free(flat);
    for (int m : part_.units[ui].modules) ledger_.free(originals[m]);
  }
  ledger_.point(init);
  return true;
}

// One step of the loop: opt.zero_grad(); loss = model(x)[0];
// loss.backward(); opt.step(). False on out of memory.
bool Fsdp1Job::step(int k) {
  const std::string step = "step" + std::to_string(k);
  label_ = step + "/forward";
  step_ = k;
  in_flight_grad_ = -1;
  run_hook(spec::Hook::kZeroGrad, -1);
  // _fsdp_root_pre_forward marks every unit as needing its pre-forward
  // unshard when forward_prefetch is on.
  for (auto& u : units_) {
    u.needs_pre_backward = u.prefetched = u.backward_done = false;
    u.needs_pre_forward = o_.forward_prefetch;
  }
  if (k == 1) cast_buffers();
  if (!walk_pytorch_step(*index_, part_, split_ties_, step, label_, hooks(k), ledger_, unit_grads_, outputs_,
                      previous_outputs_, o_.keep_outputs))
    return false;
  // Units whose backward-end marker the trace has none of (a module whose
  // inputs need no gradient: the embeddings, the root): their hooks run as
  // autograd reaches their parameters, last; here in reverse forward order.
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend() && !ledger_.oom(); ++it) post_backward(*it);
  if (ledger_.oom()) return false;
  run_hook(spec::Hook::kBackwardEnd, -1);
  finalize_params();
  end_backward(ledger_, outputs_, previous_outputs_, step);
  // opt.step(): AdamW over the shards (on the host with offload_params);
  // under scaler.step(opt), the gradients unscaled first, and scaler.update()
  // after.
  return optimizer_step(ledger_, step, o_.offload_params ? nullptr : k == 1 ? &adamw_.first : &adamw_.later,
                        o_.grad_scaler, o_.offload_params);
}

// opt.zero_grad(): set_to_none drops each shard's .grad; else zeroed in
// place, it stays (prepare_gradient keeps it as _saved_grad_shard). With
// use_orig_params the optimizer's tensors are the original parameters,
// whose .grad are views of the flat one: set_to_none drops the views, and
// the flat gradient goes only when the root's pre-forward finds every one
// of them None (_reset_flat_param_grad_info_if_needed), after the loop has
// made the next batch.
void Fsdp1Job::zero_grad() {
  const bool drop = o_.zero_grad_set_to_none || o_.offload_params;
  orig_grads_dropped_ = drop && o_.use_orig_params && !o_.offload_params;
  if (drop && !orig_grads_dropped_) drop_grads();
}

void Fsdp1Job::drop_grads() {
  orig_grads_dropped_ = false;
  for (auto& u : units_) {
    ledger_.free(u.grad_shard);
    u.grad_shard = -1;
    u.grad_dtype = DType::kF32;
  }
}

// buffer_dtype: the root's lazy init (_cast_buffers, in the first
// forward) casts each floating buffer, the old one dropped as the cast
// replaces it (setattr); the others stay as they are.
void Fsdp1Job::cast_buffers() {
  for (size_t i = 0; mixed && i < in_.buffers.size(); ++i) {
    const BufferInfo& b = in_.buffers[i];
    if (!spec::is_floating_dtype(b.dtype)) continue;
    const int64_t cast =
        alloc(Category::kParams, b.bytes / spec::dtype_element_size(b.dtype) * low, kFsdpComputeStream);
    ledger_.free(buffer_ids_[i]);
    buffer_ids_[i] = cast;
  }
}

// FSDP's hooks, where the walk through the step's trace calls them: each
// the schedule's actions for its unit (run_hook), and what FSDP records
// beside them.
StepHooks Fsdp1Job::hooks(int k) {
  StepHooks hooks;
  hooks.pre_forward = [this, k](int ui) {
    if (ui == 0 && orig_grads_dropped_) drop_grads();  // _root_pre_forward's _reset_flat_param_grad_info_if_needed
    if (k == 1) forward_order_.push_back(ui);
    run_hook(spec::Hook::kPreForward, ui);
  };
  hooks.post_forward = [this, k](int ui) {
    run_hook(spec::Hook::kPostForward, ui);
    units_[ui].needs_pre_backward = true;  // _register_pre_backward_hooks
    if (k == 1) post_forward_order_.push_back(ui);
  };
  hooks.pre_backward = [this](int ui) { run_hook(spec::Hook::kPreBackward, ui); };
  hooks.backward_begins = [this, k, pre_backward = hooks.pre_backward] {
    // scaler.scale(loss), first call: its scale and growth tracker (then
    // the scaled loss, in the trace).
    if (o_.grad_scaler && k == 1 && !grad_scaler_init(ledger_, label_)) return;
    pre_backward(0);  // the root's pre-backward (it was not resharded)
  };
  hooks.post_backward = [this](int ui) { post_backward(ui); };
  hooks.post_backward_after_last_grad = true;
  return hooks;
}

// The schedule's actions of `hook` for unit ui (-1: the step's own hooks,
// kZeroGrad and kBackwardEnd).
void Fsdp1Job::run_hook(spec::Hook hook, int ui) {
  run_schedule_hook(schedule_, hook, ui, ledger_, [&](spec::Op op, bool forward) { apply(op, ui, forward); });
}

// What each of the schedule's actions does to unit ui in FSDP1.
void Fsdp1Job::apply(spec::Op op, int ui, bool forward) {
  if (ui < 0) {
    if (op == spec::Op::kFreeShardGrad) {
      zero_grad();
    } else if (op == spec::Op::kWaitReduce) {  // _wait_for_post_backward: the last flat gradient released
      ledger_.free(in_flight_grad_);
      in_flight_grad_ = -1;
    } else {
      throw std::logic_error(std::string("FSDP's step has no action ") + spec::op_name(op));
    }
    return;
  }
  FlatParam& u = units_[ui];
  switch (op) {
    case spec::Op::kGather:  // _pre_forward_unshard / _pre_backward_hook: unshard unless prefetched
      if (!forward) u.needs_pre_backward = false;
      unshard(u);
      if (forward) {
        u.needs_pre_forward = false;
        if (no_shard && o_.offload_params && !mixed) reshard_forward_copy(ui);
      }
      return;
    case spec::Op::kPrefetchForward:  // _prefetch_handles, from the second iteration (the first records the order)
      if (step_ > 1) prefetch(ui, true);
      return;
    case spec::Op::kPrefetchBackward:
      prefetch(ui, false);
      return;
    case spec::Op::kReshard:
      reshard(u);
      return;
    case spec::Op::kAllocGrad:
      // The parameters' gradients (held by the views' SplitWithSizesBackward
      // until the last is ready) concatenated into the flat gradient,
      // param_dtype's under MixedPrecision.
      flat_grad_ = alloc(Category::kGrads, low * u.numel, kFsdpComputeStream);
      ledger_.free_all(unit_grads_[ui]);
      return;
    case spec::Op::kWaitReduce:  // the previous unit's flat gradient, freed with record_stream (in_flight_grad_)
      ledger_.free(in_flight_grad_);
      in_flight_grad_ = -1;
      return;
    case spec::Op::kReduceScatter:
      if (o_.cpu) {
        cpu_reduce_grad(ledger_, label_, W, u, flat_grad_, kPostBackwardStream, reduce, reduce_cast);
      } else {
        sharded_reduce(u, flat_grad_);
      }
      return;
    case spec::Op::kAllReduce:
      no_shard_reduce(u, flat_grad_);
      return;
    case spec::Op::kFreeShardGrad:
    case spec::Op::kAllocFlatGrad:
    case spec::Op::kZeroFlatGrad:
    case spec::Op::kRebuildBuckets:
    case spec::Op::kBroadcastBuffers:
    case spec::Op::kCloneOutputs:
      break;
  }
  throw std::logic_error(std::string("FSDP's unit has no action ") + spec::op_name(op));
}

// _unshard (also for a unit already gathered: a prefetched one, the
// root, SHARD_GRAD_OP's in backward). On the pre-all-gather stream,
// flat_param.py's pre_unshard, a no-op only for a gathered unit whose
// shard is on the GPU: with MixedPrecision the low-precision shard
// (_use_low_precision_shard: _mp_shard, copied from the fp32 shard, itself
// first copied to the GPU under offload_params and dropped with the
// statement); else, under offload_params, the shard copied to the GPU
// (_flat_param_to), dropped once flat_param points at the gathered one.
// On the all-gather stream, unless gathered, the padded unsharded
// FlatParameter (_alloc_padded_unsharded_flat_param, param_dtype); then
// post_unshard frees _mp_shard.
void Fsdp1Job::unshard(FlatParam& u) {
  if (u.numel == 0) return;
  if (no_shard && mixed) {
    // pre_unshard whatever the unit's state (NO_SHARD never "needs" an
    // unshard): _use_low_precision_shard makes _mp_shard unless its
    // storage is there already (_alloc_storage), and copies the fp32 flat
    // parameter into it, that first copied to the GPU under
    // offload_params and dropped with the statement.
    if (u.unsharded < 0) u.unsharded = alloc(Category::kParams, low * u.numel, kPreAllGatherStream);
    if (o_.offload_params) ledger_.free(alloc(Category::kParams, 4 * u.numel, kPreAllGatherStream));
    return;
  }
  if (u.unsharded >= 0 && (no_shard || !o_.offload_params)) return;
  if (no_shard) {
    // Nothing to gather; with offload_params, pre_unshard copies the
    // flat parameter to the GPU (`flat_param.data = flat_param.to(
    // device)`). The forward's copy stays alive after the reshard puts
    // the host copy back: FlattenParamsWrapper.forward made the module's
    // parameters views of it (_unflatten), and they are replaced only by
    // the next forward's; the backward's copy no view refers to.
    if (o_.offload_params) u.unsharded = alloc(Category::kParams, 4 * u.numel, kPreAllGatherStream);
    return;
  }
  int64_t copy = -1, mp_shard = -1;
  if (mixed) {
    mp_shard = alloc(Category::kParams, low * u.shard, kPreAllGatherStream);
    if (o_.offload_params) ledger_.free(alloc(Category::kParams, 4 * u.shard, kPreAllGatherStream));
  } else if (o_.offload_params) {
    copy = alloc(Category::kParams, 4 * u.shard, kPreAllGatherStream);
  }
  if (u.unsharded < 0) u.unsharded = alloc(Category::kParams, low * u.shard * W, kAllGatherStream);
  // On a CPU, Gloo's all-gather (dist.all_gather over the output's
  // chunks) makes a tensor of the output's size on the calling thread,
  // then its flat output on the worker thread, each dropped before the
  // next: one transient of the output's bytes (the meter's log).
  if (o_.cpu) ledger_.free(alloc(Category::kCommBuffers, low * u.shard * W, kAllGatherStream));
  ledger_.free(copy);
  ledger_.free(mp_shard);
}

// _reshard; freeing the gathered parameter also forgets that it was
// prefetched (_handles_prefetched.pop), so it can be prefetched again.
// NO_SHARD's frees no gathered parameter (the unit stays prefetched):
// what goes is _mp_shard (MixedPrecision, post_reshard) or, under
// offload_params, the backward's GPU copy, which no view refers to.
void Fsdp1Job::reshard(FlatParam& u) {
  if (u.unsharded >= 0 && !no_shard) u.prefetched = false;
  ledger_.free(u.unsharded);
  u.unsharded = -1;
}

// NO_SHARD's post-forward reshard: the forward's GPU copy is held by the
// module's views until the unit's next forward has made its own.
void Fsdp1Job::reshard_forward_copy(int ui) {
  const int64_t previous = forward_copy_[ui];
  forward_copy_[ui] = units_[ui].unsharded;
  units_[ui].unsharded = -1;
  ledger_.free(previous);
}

// _prefetch_handles: the unit whose forward ran just after `u`'s
// (forward_prefetch: get_handles_to_forward_prefetch) or just before it
// (backward: get_handles_to_backward_prefetch) in the recorded order,
// when it still needs that pass's unshard and was not prefetched yet.
void Fsdp1Job::prefetch(int u, bool forward) {
  const std::vector<int>& order = forward ? forward_order_ : post_forward_order_;
  const auto at = std::find(order.begin(), order.end(), u);
  if (at == order.end() || (forward ? at + 1 == order.end() : at == order.begin())) return;
  FlatParam& next = units_[*(forward ? at + 1 : at - 1)];
  if (!(forward ? next.needs_pre_forward : next.needs_pre_backward) || next.prefetched) return;
  unshard(next);
  next.prefetched = true;
}

// _post_backward_hook, after AccumulateGrad of the FlatParameter, once a
// backward: the schedule's actions (apply): the flat gradient made, the
// unit resharded, BACKWARD_POST's prefetch, the previous unit's flat
// gradient released, then this one reduced (sharded_reduce or
// cpu_reduce_grad; NO_SHARD's no_shard_reduce).
void Fsdp1Job::post_backward(int ui) {
  FlatParam& u = units_[ui];
  if (u.backward_done || u.numel == 0) return;
  u.backward_done = true;
  run_hook(spec::Hook::kPostBackward, ui);
  flat_grad_ = -1;
}

// NO_SHARD's reduce (_reduce_grad_no_shard): .grad is the new flat
// gradient, or one kept from the last step (zero_grad(set_to_none=False))
// that AccumulateGrad added the new one into, in place, dropping it. It is
// all-reduced in place (on a CPU, Gloo's allreduce over the tensor itself),
// divided before and after as the sharded reduce is (cpu_divide). With MixedPrecision or a
// reduce_dtype, on the post-backward stream: `.to(reduce_dtype)` (a
// new tensor unless it is that dtype; the old one held by
// orig_grad_data until the hook returns), the in-place all-reduce,
// then, unless keep_low_precision_grads, _cast_grad_to_param_dtype
// to fp32 (the low one dropped). .grad stays (with offload_params
// until _finalize_params, having been copied to the host).
void Fsdp1Job::no_shard_reduce(FlatParam& u, int64_t flat) {
  int64_t grad = flat;
  DType dtype = o_.mixed_precision;
  if (u.grad_shard >= 0 && !o_.offload_params) {
    ledger_.free(flat);
    grad = u.grad_shard;
    dtype = u.grad_dtype;
  }
  const int64_t orig = grad;
  if (casts && dtype != reduce_dtype) {
    grad = alloc(Category::kGrads, reduce * u.numel, kPostBackwardStream);
    dtype = reduce_dtype;
  }
  const int pre = gradient_predivide_factor(W);
  if (o_.cpu && pre > 1) cpu_divide(ledger_, label_, kPostBackwardStream);
  if (o_.cpu && W / pre > 1) cpu_divide(ledger_, label_, kPostBackwardStream);
  if (casts && !keep_low_grads && dtype != DType::kF32) {
    const int64_t fp32 = alloc(Category::kGrads, 4 * u.numel, kPostBackwardStream);
    if (grad != orig) ledger_.free(grad);
    grad = fp32;
    dtype = DType::kF32;
  }
  if (grad != orig) ledger_.free(orig);
  u.grad_shard = grad;
  u.grad_dtype = dtype;
}

// The sharded reduce on CUDA, on the post-backward stream: the gradient
// padded (F.pad: a copy of world x shard) and reduce-scattered into a new
// shard (torch.zeros_like(chunks[0])), kept as _saved_grad_shard, or
// added into it (steps after the first, grads kept by zero_grad) and
// dropped. The padded copy and the reduced shard are reduce_dtype; when
// that is not the gradient's, `param.grad.data = param.grad.data.to(
// reduce_dtype)` first makes a flat gradient in it on the post-backward
// stream (held by the hook's `grad` until it returns); when it is not fp32,
// _cast_grad_to_param_dtype makes the shard fp32 (`output.to(
// param.dtype)`), the low-precision one dropped.
void Fsdp1Job::sharded_reduce(FlatParam& u, int64_t flat) {
  const int64_t cast = reduce_cast ? alloc(Category::kGrads, reduce * u.numel, kPostBackwardStream) : -1;
  const int64_t padded = alloc(Category::kCommBuffers, reduce * u.shard * W, kPostBackwardStream);
  int64_t shard = alloc(Category::kGrads, reduce * u.shard, kPostBackwardStream);
  if (reduce_dtype != DType::kF32) {
    const int64_t fp32 = alloc(Category::kGrads, 4 * u.shard, kPostBackwardStream);
    ledger_.free(shard);
    shard = fp32;
  }
  keep_grad_shard(ledger_, u, shard);
  ledger_.free(padded);
  ledger_.free(cast);
  in_flight_grad_ = flat;
}

// _wait_for_post_backward / _finalize_params: .grad is the reduced shard;
// with offload_params it was copied to the host and the GPU one goes.
void Fsdp1Job::finalize_params() {
  if (o_.offload_params)
    for (auto& u : units_) {
      ledger_.free(u.grad_shard);
      u.grad_shard = -1;
    }
  // keep_low_precision_grads: `p.grad.data = p.grad.to(param_dtype)` for
  // each unit whose hook ran, the fp32 shard dropped; a .grad kept from the
  // step before is param_dtype already (the new shard was added into it).
  // NO_SHARD's hook left it in reduce_dtype (no _saved_grad_shard to cast).
  if (keep_low_grads && !o_.offload_params && !no_shard)
    for (auto& u : units_)
      if (u.grad_shard >= 0 && u.grad_dtype != o_.mixed_precision) {
        const int64_t cast = alloc(Category::kGrads, low * u.shard, kFsdpComputeStream);
        ledger_.free(u.grad_shard);
        u.grad_shard = cast;
        u.grad_dtype = o_.mixed_precision;
      }
}

}  // namespace

StepSimResult simulate_pytorch_fsdp(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                    const PytorchFsdpOptions& o, AllocatorModel& allocator) {
  return Fsdp1Job(in, modules, o, allocator).run();
}

}  // namespace shardfit::planner
