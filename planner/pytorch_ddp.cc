// PyTorch's DistributedDataParallel, with torch.optim.AdamW or
// ZeroRedundancyOptimizer(AdamW), as `plan --stack pytorch` replays it
// (pytorch_stack.h): the walk through the step's traces (pytorch_walk.h)
// calls DDP's hooks, and each hook takes the actions its schedule lists
// (spec/schedule.h, Runtime::kTorchDdp); this file says what each action
// allocates, citing the PyTorch source it follows (1.13 and 2.11 alike
// where nothing is said).
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "planner/pytorch_fsdp.h"
#include "planner/pytorch_ledger.h"
#include "planner/pytorch_stack.h"
#include "planner/pytorch_walk.h"
#include "spec/job.h"

namespace shardfit::planner {
namespace {

// Allocates and frees broadcast_coalesced's flat tensors in its order (at
// most kBroadcastMaxInFlight alive; a view allocates nothing). False on out
// of memory.
bool broadcast(Ledger& ledger, const std::vector<int64_t>& flats, const std::string& label) {
  std::vector<int64_t> ids;
  size_t done = 0;
  for (size_t i = 0; i < flats.size(); ++i) {
    if (i - done >= static_cast<size_t>(kBroadcastMaxInFlight)) ledger.free(ids[done++]);
    ids.push_back(flats[i] > 0 ? ledger.alloc(Category::kCommBuffers, flats[i], label) : -1);
    if (flats[i] > 0 && ids.back() < 0) return false;
  }
  for (; done < ids.size(); ++done) ledger.free(ids[done]);
  return true;
}

// The inputs and options the DDP job can replay, one line each.
void check_ddp_request(const PytorchDdpInputs& in, const PytorchDdpOptions& o) {
  if (!in.no_grads || !in.with_grads || !in.optimizer_first || !in.optimizer_later)
    throw std::invalid_argument("--stack pytorch: the trace file lacks PyTorch's step (no-grads traces and the "
                                "optimizer's steps): record it again with pytorch/trace_recorder.py");
  spec::check_steps(o.steps);
  spec::check_grad_accum(o.grad_accum);
  if (o.static_graph && in.no_grads->output_tensor_bytes.empty() && !in.no_grads->kept_outputs.empty())
    throw std::invalid_argument("--ddp-static-graph: the trace file does not list the tensors the forward returns "
                                "(DDP's first static-graph iteration clones them): record it again with "
                                "pytorch/trace_recorder.py");
  // With gradient_as_bucket_view a no_sync micro-batch makes .grad tensors of
  // its own, which the synced one then replaces by bucket views parameter by
  // parameter: not modelled.
  if (!o.wrapped && (o.world_size != 1 || o.static_graph || o.gradient_as_bucket_view || o.zero_redundancy))
    throw std::invalid_argument(
        "an unwrapped model runs on one GPU, without DDP's or ZeroRedundancyOptimizer's options");
  if (o.grad_accum > 1 && o.static_graph)
    throw std::invalid_argument("--ddp-static-graph with --grad-accum: PyTorch 1.13 cannot run it");
  if (o.grad_accum > 1 && o.gradient_as_bucket_view)
    throw std::invalid_argument("--grad-accum with --ddp-bucket-view: not simulated in this version");
}

// ZeroRedundancyOptimizer's first and later steps on this rank: its local
// AdamW over its partition only (its state, its updates); the step then
// broadcasts every rank's updated parameters in place (_sync_params:
// dist.broadcast of each parameter, parameters_as_bucket_view=False by
// default): nothing allocated.
std::pair<ModelTrace, ModelTrace> zero_redundancy_steps(const PytorchDdpInputs& in, const PytorchDdpOptions& o) {
  const auto part = zero_redundancy_partition(in.param_numels, o.world_size).at(o.rank);
  if (in.list_step_first && in.list_step_later) {
    // ZeroRedundancyOptimizer(optimizer_class=AdamW, foreach=True or
    // fused=True): the local optimizer's step over its partition's list.
    std::vector<MultiTensorAdamwStep::Entry> list;
    for (int p : part) list.push_back({p, 4 * in.param_numels[p]});
    return {in.list_step_first->compose(list), in.list_step_later->compose(list)};
  }
  if (!in.optimizer_param_steps || in.optimizer_param_steps->size() != 2 * in.param_numels.size())
    throw std::invalid_argument("--stack pytorch zero1: the trace file lacks each parameter's optimizer steps: "
                                "record it again with pytorch/trace_recorder.py");
  return {compose_optimizer_step(*in.optimizer_param_steps, part, true),
          compose_optimizer_step(*in.optimizer_param_steps, part, false)};
}

// The modules a trace's events name (its module table may be empty: traces
// made by hand).
int trace_modules(const ModelTrace& t) {
  int n = static_cast<int>(t.modules.size());
  for (const auto& e : t.events) n = std::max(n, e.module + 1);
  return n;
}

// One rank's job: init, then `steps` steps of the loop
//     opt.zero_grad(); for each micro-batch: outputs = model(x);
//     loss.backward(); then opt.step()
// with all but the last micro-batch under DDP.no_sync().
class DdpJob {
 public:
  DdpJob(const PytorchDdpInputs& in, const PytorchDdpOptions& o, AllocatorModel& allocator);
  StepSimResult run();

 private:
  bool init();
  bool step(int k);
  bool micro_batch(int k, int m);
  StepHooks hooks(int k, int m);
  void run_hook(spec::Hook hook) {
    run_schedule_hook(schedule_, hook, 0, ledger_, [this](spec::Op op, bool) { apply(op); }, syncs_);
  }
  void apply(spec::Op op);
  void rebuild_buckets();

  const PytorchDdpInputs& in_;
  const PytorchDdpOptions& o_;
  StepSimResult out_;
  Ledger ledger_;
  spec::Schedule schedule_;  // which actions each hook takes (Runtime::kTorchDdp)
  // Parameters one tensor each (as the module made them); a total alone
  // (tests) is one tensor.
  std::vector<int64_t> numels_;
  std::vector<int64_t> buckets_;       // the Reducer's bucket gradient tensors
  std::vector<int64_t> buffer_flats_;  // what each forward's buffer broadcast allocates
  ModelTrace zero_first_, zero_later_;
  spec::UnitPartition part_;
  // The two traces of a micro-batch, each indexed once over part_.
  std::optional<StepIndex> no_grads_index_, with_grads_index_;
  // The Reducer's and DDP's state, as the hooks read it.
  bool order_recorded_ = false;      // a synced backward recorded the gradients' order (rebuilt_params_)
  bool buckets_rebuilt_ = false;     // has_rebuilt_bucket_
  bool forward_param_sync_ = true;   // require_forward_param_sync: the forward before this one synced
  bool syncs_ = true;                // this micro-batch reduces (not under no_sync)
  bool first_static_ = false;        // static_graph's first synced iteration: delay_all_reduce
  const ModelTrace* fb_ = nullptr;   // this micro-batch's forward and backward
  std::vector<int64_t> grads_;       // .grad storages outside the buckets (the default mode)
  // What the previous forward returned beside the loss, held by the loop's
  // `outputs` until the next forward returns (none when it returns the loss).
  std::vector<int64_t> outputs_, previous_outputs_;
  std::string label_;
};

DdpJob::DdpJob(const PytorchDdpInputs& in, const PytorchDdpOptions& o, AllocatorModel& allocator)
    : in_(in), o_(o), ledger_(allocator, &out_), numels_(in.param_numels) {
  check_ddp_request(in, o);
  spec::ScheduleOptions schedule;
  schedule.runtime = spec::Runtime::kTorchDdp;
  schedule.ddp_bucket_cap_bytes = o.bucket_cap_bytes;
  schedule_ = pytorch_schedule(o.zero_redundancy ? spec::Sharding::kZero1 : spec::Sharding::kDdp, schedule);
  if (numels_.empty() && in.param_bytes > 0) numels_.push_back(in.param_bytes / 4);
  if (o.zero_redundancy) std::tie(zero_first_, zero_later_) = zero_redundancy_steps(in, o);
  part_ = whole_model_unit(std::max(trace_modules(*in.no_grads), trace_modules(*in.with_grads)));
  no_grads_index_.emplace(*in.no_grads, part_);
  with_grads_index_.emplace(*in.with_grads, part_);
}

StepSimResult DdpJob::run() {
  if (!init()) return out_;
  ledger_.point("init");
  for (int k = 1; k <= o_.steps; ++k)
    if (!step(k)) return out_;
  ledger_.finish();
  return out_;
}

// Init: what exists before the model (the CUDA target's fixed allocations:
// the profile's cuBLAS workspaces), the model's parameters and buffers,
// then DDP's construction:
//  - _sync_module_states (distributed/utils.py) broadcasts the parameters,
//    then the buffers, from rank 0 through broadcast_coalesced with
//    broadcast_bucket_size (250 MiB): its flat tensors come and go;
//  - the Reducer's buckets: one flat gradient tensor per bucket, as many
//    elements as its parameters (reducer.cpp Reducer::initialize_buckets:
//    `bucket.gradients = at::empty({offset}, options)`). In the first
//    iteration one bucket holds every parameter (distributed.py,
//    _ddp_init_helper: bucket_size_limits [sys.maxsize] unless
//    find_unused_parameters); kRebuildBuckets rebuilds them in
//    gradient-ready order (ddp_bucket_bytes);
//  - static_graph: Reducer::set_static_graph -> initialize_local_used_map,
//    an int32 per parameter twice.
// Before every forward that follows a synced one (DDP.forward ->
// _sync_buffers, broadcast_buffers=True by default, in training) the
// buffers are broadcast again from rank 0: buffer_flats_.
bool DdpJob::init() {
  const std::string init = "init";
  if (!alloc_each(ledger_, Category::kOverhead, o_.overhead_bytes, init)) return false;
  std::vector<CoalescedTensor> buffers;
  for (const auto& b : in_.buffers) buffers.push_back({b.dtype, b.bytes});
  std::vector<CoalescedTensor> states;
  int64_t param_bytes = 0;
  for (int64_t n : numels_) {
    states.push_back({"float32", 4 * n});
    param_bytes += 4 * n;
    if (ledger_.alloc(Category::kParams, 4 * n, init) < 0) return false;
  }
  if (!alloc_each(ledger_, Category::kParams, buffer_bytes(in_.buffers), init)) return false;
  states.insert(states.end(), buffers.begin(), buffers.end());
  if (o_.wrapped) {
    if (!broadcast(ledger_, broadcast_coalesced_flats(states, kDdpBroadcastBucketBytes), init)) return false;
    buckets_.push_back(ledger_.alloc(Category::kCommBuffers, param_bytes, init));
    if (buckets_[0] < 0) return false;
    buffer_flats_ = broadcast_coalesced_flats(buffers, kDdpBroadcastBucketBytes);
  }
  if (o_.static_graph)
    for (int i = 0; i < 2; ++i)
      if (ledger_.alloc(Category::kCommBuffers, 4 * static_cast<int64_t>(numels_.size()), init) < 0) return false;
  return true;
}

// One step: opt.zero_grad() (what it allocates itself, traced, then the
// schedule's kZeroGrad), the micro-batches, opt.step() (torch.optim.AdamW
// or this rank's ZeroRedundancyOptimizer partition, traced: step 1 creates
// its state). False on out of memory.
bool DdpJob::step(int k) {
  const std::string step = "step" + std::to_string(k);
  if (in_.zero_grad &&
      !replay(*in_.zero_grad, ledger_, step + "/forward", Category::kTemporaries, Category::kTemporaries))
    return false;
  run_hook(spec::Hook::kZeroGrad);
  if (ledger_.oom()) return false;
  for (int m = 1; m <= o_.grad_accum; ++m)
    if (!micro_batch(k, m)) return false;
  ledger_.point((o_.grad_accum == 1 ? step : step + "." + std::to_string(o_.grad_accum)) + "/backward");
  const ModelTrace& opt = o_.zero_redundancy ? (k == 1 ? zero_first_ : zero_later_)
                                             : (k == 1 ? *in_.optimizer_first : *in_.optimizer_later);
  return optimizer_step(ledger_, step, &opt, o_.grad_scaler, false);
}

// Micro-batch m of step k: forward, loss and backward. With no .grad (first
// step, or after set_to_none) in the default mode, AccumulateGrad keeps the
// gradient each op made as .grad; the reducer's hook copies it into its
// bucket (in place: reducer.cpp mark_variable_ready_dense, `bucket_view.
// copy_(grad)` / mul_out) and after the all-reduce copies the bucket back
// into it: the no-grads trace, its gradients kept. With every .grad present
// (they stayed), or with gradient_as_bucket_view (the hook points .grad at
// the bucket's view, dropping the op's gradient right after AccumulateGrad
// took it), each op's gradient is freed once accumulated: the with-grads
// trace. Under no_sync (every micro-batch but the last) the reducer expects
// no autograd hook (reducer.cpp autograd_hook returns at once), so .grad
// accumulates as without DDP.
bool DdpJob::micro_batch(int k, int m) {
  const std::string step = "step" + std::to_string(k);
  const std::string micro = o_.grad_accum == 1 ? step : step + "." + std::to_string(m);
  syncs_ = m == o_.grad_accum;
  first_static_ = o_.static_graph && syncs_ && !order_recorded_;
  const bool views = o_.gradient_as_bucket_view && !first_static_;
  fb_ = (views || !grads_.empty()) ? in_.with_grads : in_.no_grads;
  label_ = micro + "/forward";
  std::vector<std::vector<int64_t>> unit_grads{std::move(grads_)};
  const StepIndex& index = fb_ == in_.with_grads ? *with_grads_index_ : *no_grads_index_;
  const bool ok = walk_pytorch_step(index, part_, {}, micro, label_, hooks(k, m), ledger_, unit_grads, outputs_,
                                    previous_outputs_, o_.keep_outputs);
  grads_ = std::move(unit_grads[0]);
  if (!ok || ledger_.oom()) return false;
  previous_outputs_.swap(outputs_);
  run_hook(spec::Hook::kBackwardEnd);
  if (ledger_.oom()) return false;
  if (m < o_.grad_accum) ledger_.point(micro + "/backward");
  return true;
}

// DDP's hooks where the walk calls them: the root's pre-forward once per
// micro-batch, as DDP.forward begins; its post-forward as DDP.forward
// returns, before the loop's `outputs =` drops the previous outputs.
StepHooks DdpJob::hooks(int k, int m) {
  StepHooks hooks;
  hooks.pre_forward = [this, called = false](int) mutable {
    if (called) return;
    called = true;
    run_hook(spec::Hook::kPreForward);
  };
  hooks.forward_returns = [this] { run_hook(spec::Hook::kPostForward); };
  // scaler.scale(loss), first call: its scale and growth tracker.
  if (o_.grad_scaler && k == 1 && m == 1) hooks.backward_begins = [this] { grad_scaler_init(ledger_, label_); };
  return hooks;
}

// What each of the schedule's actions does in DDP.
void DdpJob::apply(spec::Op op) {
  switch (op) {
    case spec::Op::kFreeShardGrad:
      // zero_grad(set_to_none=True) drops every .grad (with
      // gradient_as_bucket_view they are views of the buckets: nothing
      // freed); set_to_none=False (PyTorch < 2.0's default) zeroes each in
      // place: they stay.
      if (o_.zero_grad_set_to_none) ledger_.free_all(grads_);
      return;
    case spec::Op::kRebuildBuckets:
      if (o_.wrapped && order_recorded_ && !buckets_rebuilt_) rebuild_buckets();
      return;
    case spec::Op::kBroadcastBuffers:
      // will_sync_module_buffers: the forward before this one synced (a
      // no_sync forward sets require_forward_param_sync False); this
      // forward's own sync then decides the next one's.
      if (forward_param_sync_) broadcast(ledger_, buffer_flats_, label_);
      forward_param_sync_ = syncs_;
      return;
    case spec::Op::kCloneOutputs:
      // _DDPSink, in the reducer's first static-graph iteration: a clone of
      // each returned tensor; the originals (what the loop would hold) go
      // as DDP.forward returns.
      if (first_static_) {
        std::vector<int64_t> clones;
        if (!alloc_each(ledger_, Category::kActivations, fb_->output_tensor_bytes, label_, &clones)) return;
        ledger_.free_all(outputs_);
        outputs_ = std::move(clones);
      }
      return;
    case spec::Op::kAllReduce:
      return;  // each bucket's gradients averaged in place
    case spec::Op::kWaitReduce:
      // finalize_backward: every bucket reduced. The backward recorded the
      // gradients' order (the next forward rebuilds the buckets). Under
      // gradient_as_bucket_view every .grad is a view of its bucket from
      // now on: in static_graph's first iteration (delay_all_reduce) the
      // gradients autograd kept until now are dropped.
      order_recorded_ = true;
      if (o_.gradient_as_bucket_view) {
        if (first_static_) ledger_.free_all(grads_);
        grads_.clear();
      }
      return;
    case spec::Op::kGather:
    case spec::Op::kReshard:
    case spec::Op::kPrefetchForward:
    case spec::Op::kPrefetchBackward:
    case spec::Op::kAllocGrad:
    case spec::Op::kReduceScatter:
    case spec::Op::kAllocFlatGrad:
    case spec::Op::kZeroFlatGrad:
      break;
  }
  throw std::logic_error(std::string("DDP has no action ") + spec::op_name(op));
}

// Reducer::rebuild_buckets, in the first forward after the first synced
// backward recorded the gradients' order: sync_bucket_indices' four int32
// tensors, then initialize_buckets frees the old buckets and makes the new.
void DdpJob::rebuild_buckets() {
  buckets_rebuilt_ = true;
  const std::vector<int64_t> rebuilt = ddp_bucket_bytes(numels_, o_.bucket_cap_bytes);
  std::vector<int64_t> sync;
  if (!alloc_each(ledger_, Category::kCommBuffers, ddp_rebuild_sync_tensors(numels_, rebuilt.size()), label_, &sync))
    return;
  ledger_.free_all(sync);
  ledger_.free_all(buckets_);
  alloc_each(ledger_, Category::kCommBuffers, rebuilt, label_, &buckets_);
}

}  // namespace

StepSimResult simulate_pytorch_ddp(const PytorchDdpInputs& in, const PytorchDdpOptions& o) {
  if (o.cuda_caching) {
    CudaCachingAllocatorModel a(o.budget_bytes);
    return simulate_pytorch_ddp(in, o, a);
  }
  ExactAllocator a(o.budget_bytes);
  return simulate_pytorch_ddp(in, o, a);
}

StepSimResult simulate_pytorch_ddp(const PytorchDdpInputs& in, const PytorchDdpOptions& o, AllocatorModel& allocator) {
  return DdpJob(in, o, allocator).run();
}

}  // namespace shardfit::planner
