#include "planner/pytorch_fsdp2.h"

#include <algorithm>
#include <optional>
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
// (docs/pytorch-validation.md, "Late frees"): the plan is the program order.
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

namespace {

// One rank's (rank 0's) FSDP2 job: the groups' state across the steps, and
// each phase of the loop (init, then per step zero_grad, the forward and
// backward through the hooks, the backward's end, the optimizer step) as a
// method, in the order run() calls them.
class Fsdp2Job {
 public:
  Fsdp2Job(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules, const PytorchFsdp2Options& o,
           AllocatorModel& allocator);
  StepSimResult run();

 private:
  bool init();
  bool step(int k);
  StepHooks hooks(int k);
  void run_hook(spec::Hook hook, int gi);
  void apply(spec::Op op, int gi, bool forward);
  void unshard(Group& g);
  void wait_for_unshard(Group& g, bool forward);
  void reshard(Group& g);
  int64_t take_last_param_grad(int gi);
  void post_backward(int gi);
  void reduce_scatter(int gi);
  void finalize_backward();
  int block_index(int gi) const {
    const auto it = std::find(blocks_.begin(), blocks_.end(), gi);
    return it == blocks_.end() ? -1 : static_cast<int>(it - blocks_.begin());
  }
  int64_t alloc(Category c, int64_t bytes, int stream) { return ledger_.alloc(c, bytes, label_, stream); }

  const PytorchDdpInputs& in_;
  const std::vector<ModuleNode>& modules_;
  const PytorchFsdp2Options& o_;
  const int W;
  const bool mixed;
  // What is gathered and computed with: param_dtype's element; what is
  // reduced: reduce_dtype's (param_dtype's unless fp32 is asked for).
  const int64_t low, reduce;
  StepSimResult out_;
  Ledger ledger_;
  spec::UnitPartition part_;
  std::optional<StepIndex> index_;  // the step's trace over part_
  spec::Schedule schedule_;  // which actions each hook takes (Runtime::kTorchFsdp2)
  std::vector<Group> groups_;
  // The blocks (every group but the root's), in module order: the lists
  // explicit prefetching names.
  std::vector<int> blocks_;
  ShardedAdamw adamw_;
  // FSDPCommContext: the last forward all-gather's output, kept until the
  // next group's copy-out (all_gather_state), and the last reduce-scatter's
  // input, kept until the next group's reduce (reduce_scatter_state).
  int64_t all_gather_state_ = -1, reduce_scatter_state_ = -1;
  std::vector<int> post_forward_order_;
  std::vector<int64_t> outputs_, previous_outputs_;
  std::vector<std::vector<int64_t>> unit_grads_;
  std::vector<std::vector<std::pair<int, int64_t>>> grad_origins_;  // beside unit_grads
  std::string label_;
};

Fsdp2Job::Fsdp2Job(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules, const PytorchFsdp2Options& o,
                   AllocatorModel& allocator)
    : in_(in),
      modules_(modules),
      o_(o),
      W((check_fsdp_request(in, o.world_size, o.steps, "FSDP2"), o.world_size)),
      mixed(o.mixed_precision != DType::kF32),
      low(dtype_bytes(o.mixed_precision)),
      reduce(dtype_bytes(o.reduce_dtype.value_or(o.mixed_precision))),
      ledger_(allocator, &out_) {
  // A world of one copies each shard into an fp32 `empty_like` of it
  // (_fsdp_param_group.py wait_for_unshard), so the model would compute in
  // fp32, not what a low-precision trace recorded.
  if (mixed && W == 1)
    throw std::invalid_argument("--stack pytorch FSDP2: MixedPrecisionPolicy on one GPU is not simulated in this "
                                "version");
  // The groups: fully_shard on each block, then on the root, which manages
  // what no block does. A tied parameter belongs to one group
  // (_fsdp_state.py _validate_no_duplicate_params refuses it in two).
  part_ = spec::wrap_modules(modules, spec::WrapPolicy::parse(o.wrap_blocks ? "block" : "none"),
                             spec::TiedParams::kKeepTogether);
  index_.emplace(*in.no_grads, part_);
  // HSDP reshards as zero3 does; its all-reduce is reduce_scatter's.
  spec::ScheduleOptions schedule;
  schedule.prefetch = o.prefetch;
  schedule.runtime = spec::Runtime::kTorchFsdp2;
  schedule.reshard_root_after_forward = o.reshard_root_after_forward;
  schedule_ = pytorch_schedule(o.reshard_after_forward ? spec::Sharding::kZero3 : spec::Sharding::kZero2,
                                    schedule);
  groups_.resize(part_.units.size());
  for (size_t g = 0; g < part_.units.size(); ++g)
    if (part_.units[g].root_module != 0) blocks_.push_back(static_cast<int>(g));
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const ParamInfo& p : part_.units[g].params) {
      groups_[g].shard.push_back(fsdp2_shard_numel(p, W));
      groups_[g].shard_sum += groups_[g].shard.back();
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
  adamw_ = sharded_adamw_steps(in, shards);
  unit_grads_.resize(groups_.size());
  grad_origins_.resize(groups_.size());
}

StepSimResult Fsdp2Job::run() {
  if (!init()) return out_;
  for (int k = 1; k <= o_.steps; ++k)
    if (!step(k)) return out_;
  ledger_.finish();
  return out_;
}

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
bool Fsdp2Job::init() {
  const std::string init = "init";
  if (!alloc_each(ledger_, Category::kOverhead, o_.overhead_bytes, init)) return false;
  std::vector<std::vector<int64_t>> originals(groups_.size());
  if (o_.cpu)
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int64_t> bytes;
      for (const ParamInfo& p : part_.units[g].params) bytes.push_back(4 * p.numel);
      if (!alloc_each(ledger_, Category::kParams, bytes, init, &originals[g])) return false;
    }
  if (!alloc_each(ledger_, Category::kParams, buffer_bytes(in_.buffers), init)) return false;
  std::vector<int> shard_order = blocks_;
  for (size_t g = 0; g < groups_.size(); ++g)
    if (block_index(static_cast<int>(g)) < 0) shard_order.push_back(static_cast<int>(g));
  for (int g : shard_order) {
    if (!o_.offload_params)
      for (int64_t s : groups_[g].shard)
        if (ledger_.alloc(Category::kParams, 4 * s, init) < 0) return false;
    ledger_.free_all(originals[g]);
  }
  ledger_.point(init);
  return true;
}

// One step of the loop: opt.zero_grad(); loss = model(x)[0];
// loss.backward(); opt.step(). False on out of memory.
bool Fsdp2Job::step(int k) {
  const std::string step = "step" + std::to_string(k);
  label_ = step + "/forward";
  // opt.zero_grad(): set_to_none drops every sharded .grad, and with the
  // last view the flat output; else each is zeroed in place and stays.
  run_hook(spec::Hook::kZeroGrad, -1);
  for (Group& g : groups_) g.pre_backward_done = g.post_backward_done = false;
  if (!walk_pytorch_step(*index_, part_, SplitTieGrads{}, step, label_, hooks(k), ledger_, unit_grads_, outputs_,
                      previous_outputs_, o_.keep_outputs, &grad_origins_))
    return false;
  finalize_backward();
  if (ledger_.oom()) return false;
  post_forward_order_.clear();
  end_backward(ledger_, outputs_, previous_outputs_, step);
  // opt.step(): AdamW over the sharded parameters (on the host under
  // CPUOffloadPolicy); under scaler.step(opt), unscaled first, and
  // scaler.update() after.
  return optimizer_step(ledger_, step, o_.offload_params ? nullptr : k == 1 ? &adamw_.first : &adamw_.later,
                        o_.grad_scaler, o_.offload_params);
}

// FSDP2's hooks, where the walk through the step's trace calls them: each
// the schedule's actions for its group (run_hook), and what FSDPState
// records beside them.
StepHooks Fsdp2Job::hooks(int k) {
  StepHooks hooks;
  hooks.pre_forward = [this](int gi) { run_hook(spec::Hook::kPreForward, gi); };
  hooks.post_forward = [this](int gi) {
    run_hook(spec::Hook::kPostForward, gi);
    // The post-forward order, which the implicit backward prefetch follows;
    // the root's _post_forward frees the last all-gather's output.
    groups_[gi].post_forward_index = static_cast<int>(post_forward_order_.size());
    post_forward_order_.push_back(gi);
    if (gi == 0) {
      ledger_.free(all_gather_state_);
      all_gather_state_ = -1;
    }
  };
  // A group's backward hooks run once a backward however many of its
  // modules' gradients reach them.
  hooks.pre_backward = [this](int gi) {
    if (groups_[gi].pre_backward_done) return;
    groups_[gi].pre_backward_done = true;
    run_hook(spec::Hook::kPreBackward, gi);
  };
  hooks.backward_begins = [this, k, pre_backward = hooks.pre_backward] {
    // scaler.scale(loss), first call (ShardedGradScaler, fp16): its scale
    // and growth tracker, then the scaled loss (in the trace).
    if (o_.grad_scaler && k == 1 && !grad_scaler_init(ledger_, label_)) return;
    pre_backward(0);  // the root's hook on the loss
  };
  hooks.post_backward = [this](int gi) { post_backward(gi); };
  hooks.backward_ends = [this] { finalize_backward(); };
  return hooks;
}

void Fsdp2Job::post_backward(int gi) {
  if (groups_[gi].post_backward_done) return;
  groups_[gi].post_backward_done = true;
  run_hook(spec::Hook::kPostBackward, gi);
}

// The schedule's actions of `hook` for group gi (-1: the step's own hooks,
// kZeroGrad and kBackwardEnd).
void Fsdp2Job::run_hook(spec::Hook hook, int gi) {
  run_schedule_hook(schedule_, hook, gi, ledger_, [&](spec::Op op, bool forward) { apply(op, gi, forward); });
}

// What each of the schedule's actions does to group gi in FSDP2.
void Fsdp2Job::apply(spec::Op op, int gi, bool forward) {
  if (gi < 0) {
    if (op == spec::Op::kFreeShardGrad) {
      // opt.zero_grad(): set_to_none drops every sharded .grad, and with
      // the last view the flat output; else each is zeroed in place and
      // stays.
      for (Group& g : groups_)
        if (o_.zero_grad_set_to_none) {
          ledger_.free(g.grad_flat);
          g.grad_flat = -1;
          g.has_grads = false;
        }
    } else if (op == spec::Op::kWaitReduce) {  // the backward's end: the last reduce-scatter's input
      ledger_.free(reduce_scatter_state_);
      reduce_scatter_state_ = -1;
    } else {
      throw std::logic_error(std::string("FSDP2's step has no action ") + spec::op_name(op));
    }
    return;
  }
  Group& g = groups_[gi];
  const int n = schedule_.prefetch();
  switch (op) {
    case spec::Op::kGather:  // FSDPParamGroup.pre_forward / pre_backward: unshard() unless prefetched, then wait
      unshard(g);
      wait_for_unshard(g, forward);
      return;
    case spec::Op::kPrefetchForward:
      // FSDPState._pre_forward, then _prefetch_unshard(..., "forward") of
      // each module set_modules_to_forward_prefetch named (the example's
      // lists stop where the blocks do).
      if (const int b = block_index(gi); b >= 0 && b + n - 1 < static_cast<int>(blocks_.size()))
        for (int j = 1; j < n; ++j) unshard(groups_[blocks_[b + j]]);
      return;
    case spec::Op::kPrefetchBackward:
      // _backward_prefetch: an explicit list (set_modules_to_backward_
      // prefetch) replaces the implicit prefetch (default_prefetch is
      // False then) of the group whose forward ended just before this one's.
      if (const int b = block_index(gi); n >= 2 && b >= n) {
        for (int j = 1; j <= n; ++j) unshard(groups_[blocks_[b - j]]);
      } else if (g.post_forward_index > 0) {
        unshard(groups_[post_forward_order_[g.post_forward_index - 1]]);
      }
      return;
    case spec::Op::kReshard:
      reshard(g);
      return;
    case spec::Op::kWaitReduce:
      // The previous reduce-scatter's input, dropped by the next group that
      // has gradients to reduce (post_backward returns before touching
      // comm_ctx when it has none).
      if (!unit_grads_[gi].empty()) {
        ledger_.free(reduce_scatter_state_);
        reduce_scatter_state_ = -1;
      }
      return;
    case spec::Op::kReduceScatter:
      reduce_scatter(gi);
      return;
    case spec::Op::kFreeShardGrad:
    case spec::Op::kAllocGrad:
    case spec::Op::kAllReduce:
    case spec::Op::kAllocFlatGrad:
    case spec::Op::kZeroFlatGrad:
    case spec::Op::kRebuildBuckets:
    case spec::Op::kBroadcastBuffers:
    case spec::Op::kCloneOutputs:
      break;
  }
  throw std::logic_error(std::string("FSDP2 has no action ") + spec::op_name(op));
}

// FSDPParamGroup.unshard -> _fsdp_collectives.py foreach_all_gather, on
// the copy-in stream: the all-gather inputs (_get_param_all_gather_inputs:
// under CPUOffloadPolicy each shard copied to the GPU (on a CPU mesh the
// shard itself), then cast to param_dtype with a policy, the fp32 copy
// dropped; else with a policy one
// flat param_dtype copy of every shard, the foreach-copy fast path; else
// the shards themselves), the flat output of world x Σ shard elements
// (all_gather_copy_in: the input is its own slice of it), the inputs
// dropped once copied in. A world of one gathers nothing.
void Fsdp2Job::unshard(Group& g) {
  if (g.gathering || g.unsharded) return;
  g.gathering = true;
  if (W == 1) return;
  std::vector<int64_t> inputs;
  if (o_.offload_params || (o_.offload_on_host && mixed)) {
    for (int64_t s : g.shard) {
      int64_t id = o_.offload_params ? alloc(Category::kParams, 4 * s, kAllGatherCopyInStream) : -1;
      if (mixed) {
        const int64_t cast = alloc(Category::kParams, low * s, kAllGatherCopyInStream);
        ledger_.free(id);
        id = cast;
      }
      inputs.push_back(id);
    }
  } else if (mixed) {
    inputs.push_back(alloc(Category::kCommBuffers, low * g.shard_sum, kAllGatherCopyInStream));
  }
  g.pending = alloc(Category::kCommBuffers, low * g.shard_sum * W, kAllGatherCopyInStream);
  if (o_.cpu) gloo_all_gather(ledger_, low * g.shard_sum * W, label_);
  ledger_.free_all(inputs);
}

// FSDPParamGroup.wait_for_unshard: in forward the previous group's flat
// output (the implicit prefetch's deferred free) is released from
// comm_ctx.all_gather_state first, but torch 2.11 binds it to a local
// (`if prev_all_gather_state := self.comm_ctx.all_gather_state`), which
// holds it until wait_for_unshard returns: past the copy-out (the meter's
// log; the peak when the next all-gather was prefetched before this
// forward). Each parameter's all_gather_outputs (world x its shard,
// param_dtype) made on the compute stream and copied out into
// (foreach_all_gather_copy_out); then this flat output kept as
// all_gather_state in forward, freed at once in backward. A world of one
// copies each shard (empty_like, fp32).
void Fsdp2Job::wait_for_unshard(Group& g, bool forward) {
  if (!g.gathering) return;
  g.gathering = false;
  const int64_t previous = forward ? all_gather_state_ : -1;
  if (forward) all_gather_state_ = -1;
  for (int64_t s : g.shard) g.outputs.push_back(alloc(Category::kParams, low * s * W, kFsdp2ComputeStream));
  ledger_.free(previous);
  g.unsharded = true;
  if (W > 1 && forward) {
    all_gather_state_ = g.pending;
  } else {
    ledger_.free(g.pending);
  }
  g.pending = -1;
}

void Fsdp2Job::reshard(Group& g) {  // FSDPParam.to_sharded: free_storage of each all_gather_output
  ledger_.free_all(g.outputs);
  g.unsharded = false;
}

// The id of group gi's last parameter's gradient (its fsdp_params are
// its modules' parameters in named_parameters() order, as the unit's),
// taken out of unit_grads[gi]: the last gradient the trace made in the
// module owning that parameter, of its bytes. -1 when none is.
int64_t Fsdp2Job::take_last_param_grad(int gi) {
  const spec::Unit& u = part_.units[gi];
  int owner = -1;
  for (int m : u.modules)
    if (!modules_[m].params.empty()) owner = m;
  if (owner < 0) return -1;
  const int64_t bytes = low * modules_[owner].params.back().numel;
  for (size_t i = unit_grads_[gi].size(); i-- > 0;)
    if (grad_origins_[gi][i] == std::make_pair(owner, bytes)) {
      const int64_t id = unit_grads_[gi][i];
      unit_grads_[gi].erase(unit_grads_[gi].begin() + static_cast<std::ptrdiff_t>(i));
      grad_origins_[gi].erase(grad_origins_[gi].begin() + static_cast<std::ptrdiff_t>(i));
      return id;
    }
  return -1;
}

// FSDPParamGroup.post_backward's foreach_reduce, once the schedule has
// resharded the group and dropped the previous reduce-scatter's input
// (nothing when the group got no gradient): its input of
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
void Fsdp2Job::reduce_scatter(int gi) {
  Group& g = groups_[gi];
  if (unit_grads_[gi].empty()) return;
  const int64_t input = alloc(Category::kCommBuffers, reduce * g.shard_sum * W, kFsdp2ComputeStream);
  // foreach_reduce's loop over zip(fsdp_params, unsharded_grads) (for
  // Shard(i > 0), run whenever world_size > 1) leaves its variable
  // `unsharded_grad` bound to the group's last gradient, so
  // `unsharded_grads.clear()` frees every gradient but that one, which
  // goes when foreach_reduce returns (_fsdp_collectives.py).
  const int64_t last_grad = W > 1 ? take_last_param_grad(gi) : -1;
  ledger_.free_all(unit_grads_[gi]);  // and clears the list
  grad_origins_[gi].clear();
  int64_t reduced = alloc(Category::kGrads, reduce * g.shard_sum, kReduceScatterStream);
  if (o_.cpu) gloo_reduce_scatter(ledger_, reduce * g.shard_sum * W, label_);
  if (o_.hsdp) {
    g.all_reduce_state = reduced;
    if (reduce != 4) reduced = alloc(Category::kGrads, 4 * g.shard_sum, kAllReduceStream);
  } else if (reduce != 4) {
    const int64_t fp32 = alloc(Category::kGrads, 4 * g.shard_sum, kReduceScatterStream);
    ledger_.free(reduced);
    reduced = fp32;
  }
  if (o_.offload_params || g.has_grads) {
    if (reduced != g.all_reduce_state) ledger_.free(reduced);
  } else {
    g.grad_flat = reduced;
  }
  g.has_grads = true;
  reduce_scatter_state_ = input;
  ledger_.free(last_grad);
}

// _root_post_backward_final_callback, queued on the autograd engine, so it
// runs after the backward's last op and before the graph's teardown
// (StepHooks::backward_ends; after the walk for a trace naming no op):
// every group whose post-backward did not run (the root's inputs need no
// gradient), in all_states order
// (the root's first), each then finalized (finalize_backward: the
// all-reduce state released, a prefetch no backward used dropped); then
// the last reduce-scatter's input goes.
void Fsdp2Job::finalize_backward() {
  for (size_t gi = 0; gi < groups_.size() && !ledger_.oom(); ++gi) {
    Group& g = groups_[gi];
    post_backward(static_cast<int>(gi));
    if (g.all_reduce_state != g.grad_flat) ledger_.free(g.all_reduce_state);
    g.all_reduce_state = -1;
    if (g.gathering) {
      ledger_.free(g.pending);
      g.pending = -1;
      g.gathering = false;
    }
  }
  if (!ledger_.oom()) run_hook(spec::Hook::kBackwardEnd, -1);
}

}  // namespace

StepSimResult simulate_pytorch_fsdp2(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                     const PytorchFsdp2Options& o, AllocatorModel& allocator) {
  return Fsdp2Job(in, modules, o, allocator).run();
}

}  // namespace shardfit::planner
