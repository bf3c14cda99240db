#include "planner/pytorch_stack.h"

#include "planner/pytorch_ledger.h"
#include "planner/pytorch_walk.h"
#include "spec/grad_buckets.h"
#include "spec/job.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>

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

}  // namespace

std::optional<DType> parse_fsdp_reduce_dtype(const std::string& name) {
  if (name == "param") return std::nullopt;
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  throw std::invalid_argument("expected param, fp32, bf16 or fp16");
}

TorchDefaults torch_defaults(const std::string& torch) {
  // 1.13: Optimizer.zero_grad(set_to_none=False), checkpoint(use_reentrant=True)
  // (torch/optim/optimizer.py, torch/utils/checkpoint.py at v1.13.0).
  if (torch == "1.13") return {"zero", "reentrant"};
  // 2.11: zero_grad(set_to_none=True) (optimizer.py at v2.11.0); checkpoint()
  // given no use_reentrant warns and runs True, but transformers 5.17's
  // gradient_checkpointing_enable() passes use_reentrant=False
  // (modeling_utils.py), as torch's warning recommends.
  if (torch == kPinnedTorch) return {"none", "non-reentrant"};
  throw std::invalid_argument(std::string("expected ") + kPinnedTorch +
                              " (the pinned stack) or 1.13 (2022's, the reference scenario's)");
}

bool adamw_foreach_default(const std::string& torch, bool cuda, bool flat_parameters) {
  return torch != "1.13" && cuda && !flat_parameters;
}

bool grad_scaler_init(Ledger& ledger, const std::string& label) {
  for (int64_t b : {kGradScalerScaleBytes, kGradScalerGrowthTrackerBytes})
    if (ledger.alloc(Category::kOptimizer, b, label) < 0) return false;
  return true;
}

// grad_scaler.py 1.13's unscale_, in its order (pytorch_stack.h).
bool grad_scaler_unscale(Ledger& ledger, const std::string& label, int64_t& found_inf_copy, bool host_grads) {
  const Category c = Category::kOptimizer;
  const int64_t dbl = ledger.alloc(c, 8, label);  // self._scale.double()
  if (dbl < 0) return false;
  const int64_t rec = ledger.alloc(c, 8, label);  // .reciprocal()
  if (rec < 0) return false;
  ledger.free(dbl);
  const int64_t inv = ledger.alloc(c, 4, label);  // .float()
  if (inv < 0) return false;
  ledger.free(rec);
  const int64_t found = ledger.alloc(c, 4, label);  // torch.full((1,), 0.0)
  if (found < 0) return false;
  if (host_grads) {
    // ShardedGradScaler, the gradients on the host: both copies made there;
    // the found_inf synced through a GPU copy (`v_on_cuda = v.cuda()`),
    // alive until unscale_ returns.
    const int64_t on_gpu = ledger.alloc(c, 4, label);
    if (on_gpu < 0) return false;
    ledger.free(on_gpu);
  } else {
    found_inf_copy = ledger.alloc(c, 4, label);  // per_device_found_inf.get(device)
    if (found_inf_copy < 0) return false;
    const int64_t inv_copy = ledger.alloc(c, 4, label);  // per_device_inv_scale.get(device)
    if (inv_copy < 0) return false;
    ledger.free(inv_copy);  // _unscale_grads_ returns
  }
  ledger.free(inv);  // unscale_ returns
  ledger.free(found);
  return true;
}

bool grad_scaler_update(Ledger& ledger, const std::string& label, int64_t found_inf_copy, bool host_grads) {
  ledger.free(found_inf_copy);
  if (!host_grads) return true;
  // The host found_inf brought to the scale's device (`found_inf.to(device=
  // _scale.device)`), dropped as update() returns.
  const int64_t copy = ledger.alloc(Category::kOptimizer, 4, label);
  if (copy < 0) return false;
  ledger.free(copy);
  return true;
}

bool alloc_each(Ledger& ledger, Category c, const std::vector<int64_t>& bytes, const std::string& label,
                std::vector<int64_t>* ids) {
  for (int64_t b : bytes) {
    const int64_t id = ledger.alloc(c, b, label);
    if (ids) ids->push_back(id);
    if (id < 0) return false;
  }
  return true;
}

std::vector<int64_t> buffer_bytes(const std::vector<BufferInfo>& buffers) {
  std::vector<int64_t> bytes;
  for (const BufferInfo& b : buffers) bytes.push_back(b.bytes);
  return bytes;
}

void end_backward(Ledger& ledger, std::vector<int64_t>& outputs, std::vector<int64_t>& previous_outputs,
                  const std::string& step) {
  previous_outputs.swap(outputs);
  outputs.clear();
  ledger.point(step + "/backward");
}

bool optimizer_step(Ledger& ledger, const std::string& step, const ModelTrace* adamw, bool grad_scaler,
                    bool host_grads) {
  const std::string label = step + "/optimizer";
  int64_t found_inf_copy = -1;
  if (grad_scaler && !grad_scaler_unscale(ledger, label, found_inf_copy, host_grads)) return false;
  if (adamw && !replay(*adamw, ledger, label, Category::kTemporaries, Category::kOptimizer))
    return false;
  if (grad_scaler && !grad_scaler_update(ledger, label, found_inf_copy, host_grads)) return false;
  ledger.point(label);
  return true;
}

bool replay(const ModelTrace& t, Ledger& ledger, const std::string& label, Category transient, Category kept) {
  std::unordered_map<int64_t, int64_t> live;  // trace storage -> ledger id
  std::unordered_map<int64_t, bool> freed;
  for (const auto& e : t.events)
    if (e.kind == MemEvent::kFree) freed[e.tensor] = true;
  for (const auto& e : t.events) {
    if (e.kind == MemEvent::kAlloc) {
      const int64_t id = ledger.alloc(freed.count(e.tensor) ? transient : kept, e.bytes, label);
      if (id < 0) return false;
      live[e.tensor] = id;
    } else if (e.kind == MemEvent::kFree) {
      if (auto it = live.find(e.tensor); it != live.end()) {
        ledger.free(it->second);
        live.erase(it);
      }
    }
  }
  return true;
}


std::vector<int64_t> broadcast_coalesced_flats(const std::vector<CoalescedTensor>& tensors, int64_t bucket_bytes) {
  struct Bucket {
    size_t first = 0;
    int count = 0;
    int64_t bytes = 0;
  };
  std::vector<Bucket> closed;
  std::vector<std::pair<std::string, Bucket>> open;  // per dtype, in first-seen order
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto it = std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == tensors[i].dtype; });
    if (it == open.end()) it = open.insert(open.end(), {tensors[i].dtype, Bucket{}});
    Bucket& b = it->second;
    if (b.count == 0) b.first = i;
    ++b.count;
    b.bytes += tensors[i].bytes;
    if (b.bytes >= bucket_bytes) {
      closed.push_back(b);
      b = Bucket{};
    }
  }
  for (const auto& o : open)
    if (o.second.count > 0) closed.push_back(o.second);
  std::stable_sort(closed.begin(), closed.end(), [](const Bucket& a, const Bucket& b) { return a.first < b.first; });
  std::vector<int64_t> flats;
  for (const auto& b : closed) flats.push_back(b.count > 1 ? b.bytes : 0);
  return flats;
}

std::vector<int64_t> ddp_bucket_bytes(const std::vector<int64_t>& param_numels, int64_t bucket_cap_bytes) {
  std::vector<int64_t> param_bytes;
  for (int64_t n : param_numels) param_bytes.push_back(4 * n);  // fp32 parameters
  std::vector<int64_t> buckets;
  for (const std::vector<int>& members : spec::assign_buckets_by_size(param_bytes, bucket_cap_bytes)) {
    int64_t bytes = 0;
    for (int i : members) bytes += param_bytes[i];
    buckets.push_back(bytes);
  }
  return buckets;
}

std::vector<int64_t> ddp_rebuild_sync_tensors(const std::vector<int64_t>& param_numels, size_t buckets) {
  const int64_t indices = 4 * (static_cast<int64_t>(param_numels.size()) + 1);
  const int64_t sizes = 4 * static_cast<int64_t>(buckets);
  return {indices, indices, sizes, sizes};
}

int64_t ddp_rebuild_sync_bytes(const std::vector<int64_t>& param_numels, int64_t bucket_cap_bytes) {
  int64_t total = 0;
  for (int64_t b : ddp_rebuild_sync_tensors(param_numels, ddp_bucket_bytes(param_numels, bucket_cap_bytes).size()))
    total += b;
  return total;
}

std::vector<std::vector<int>> zero_redundancy_partition(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw std::invalid_argument("world size must be at least 1");
  std::vector<int> order(numels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return numels[a] > numels[b]; });
  std::vector<std::vector<int>> out(world_size);
  std::vector<int64_t> sizes(world_size, 0);
  for (int p : order) {
    const int r = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    out[r].push_back(p);
    sizes[r] += numels[p];
  }
  return out;
}

namespace {

// The inputs and options simulate_pytorch_ddp can replay, one line each.
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
// AdamW over its partition only.
std::pair<ModelTrace, ModelTrace> zero_redundancy_steps(const PytorchDdpInputs& in, const PytorchDdpOptions& o) {
  ModelTrace zero_first, zero_later;
// ZeroRedundancyOptimizer: this rank's local AdamW holds its partition only
// (its state, its updates); the step then broadcasts every rank's updated
// parameters in place (_sync_params: dist.broadcast of each parameter,
// parameters_as_bucket_view=False by default): nothing allocated.
  const auto part = zero_redundancy_partition(in.param_numels, o.world_size).at(o.rank);
  if (in.list_step_first && in.list_step_later) {
    // ZeroRedundancyOptimizer(optimizer_class=AdamW, foreach=True or
    // fused=True): the local optimizer's step over its partition's list.
    std::vector<MultiTensorAdamwStep::Entry> list;
    for (int p : part) list.push_back({p, 4 * in.param_numels[p]});
    zero_first = in.list_step_first->compose(list);
    zero_later = in.list_step_later->compose(list);
  } else {
    if (!in.optimizer_param_steps || in.optimizer_param_steps->size() != 2 * in.param_numels.size())
      throw std::invalid_argument("--stack pytorch zero1: the trace file lacks each parameter's optimizer steps: "
                                  "record it again with pytorch/trace_recorder.py");
    zero_first = compose_optimizer_step(*in.optimizer_param_steps, part, true);
    zero_later = compose_optimizer_step(*in.optimizer_param_steps, part, false);
  }
  return {std::move(zero_first), std::move(zero_later)};
}

// DDP's init on the ledger; false when it runs out of memory. Leaves the
// reducer's first bucket in `buckets` and the flat tensors each forward's
// buffer broadcast makes in `buffer_flats`.
bool ddp_init(Ledger& ledger, const PytorchDdpInputs& in, const PytorchDdpOptions& o,
              const std::vector<int64_t>& numels, std::vector<int64_t>& buckets, std::vector<int64_t>& buffer_flats) {
  // Init: what exists before the model (the CUDA target's fixed
  // allocations: the profile's cuBLAS workspaces), the model's parameters
  // and buffers, then DDP's construction:
  //  - _sync_module_states (distributed/utils.py) broadcasts the parameters,
  //    then the buffers, from rank 0 through broadcast_coalesced with
  //    broadcast_bucket_size (250 MiB): its flat tensors come and go;
  //  - the Reducer's buckets: one flat gradient tensor per bucket, as many
  //    elements as its parameters (reducer.cpp Reducer::initialize_buckets:
  //    `bucket.gradients = at::empty({offset}, options)`). In the first
  //    iteration one bucket holds every parameter (distributed.py,
  //    _ddp_init_helper: bucket_size_limits [sys.maxsize] unless
  //    find_unused_parameters); the second forward rebuilds them in
  //    gradient-ready order (ddp_bucket_bytes).
  const std::string init = "init";
  if (!alloc_each(ledger, Category::kOverhead, o.overhead_bytes, init)) return false;
  std::vector<CoalescedTensor> buffers;
  for (const auto& b : in.buffers) buffers.push_back({b.dtype, b.bytes});
  std::vector<CoalescedTensor> states;
  int64_t param_bytes = 0;
  for (int64_t n : numels) {
    states.push_back({"float32", 4 * n});
    param_bytes += 4 * n;
    if (ledger.alloc(Category::kParams, 4 * n, init) < 0) return false;
  }
  if (!alloc_each(ledger, Category::kParams, buffer_bytes(in.buffers), init)) return false;
  states.insert(states.end(), buffers.begin(), buffers.end());
  if (o.wrapped) {
    if (!broadcast(ledger, broadcast_coalesced_flats(states, kDdpBroadcastBucketBytes), init)) return false;
    buckets.push_back(ledger.alloc(Category::kCommBuffers, param_bytes, init));
    if (buckets[0] < 0) return false;
  }
  if (o.static_graph)  // Reducer::set_static_graph -> initialize_local_used_map
    for (int i = 0; i < 2; ++i)
      if (ledger.alloc(Category::kCommBuffers, 4 * static_cast<int64_t>(numels.size()), init) < 0) return false;
  // Before every forward (DDP.forward -> _sync_buffers, broadcast_buffers=True
  // by default, in training): the buffers broadcast again from rank 0.
  buffer_flats = o.wrapped ? broadcast_coalesced_flats(buffers, kDdpBroadcastBucketBytes) : std::vector<int64_t>{};
  return true;
}

// The modules a trace's events name (its module table may be empty: traces
// made by hand).
int trace_modules(const ModelTrace& t) {
  int n = static_cast<int>(t.modules.size());
  for (const auto& e : t.events) n = std::max(n, e.module + 1);
  return n;
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
  check_ddp_request(in, o);
  StepSimResult out;
  Ledger ledger(allocator, &out);
  // Parameters one tensor each (as the module made them); a total alone
  // (tests) is one tensor.
  std::vector<int64_t> numels = in.param_numels;
  if (numels.empty() && in.param_bytes > 0) numels.push_back(in.param_bytes / 4);

  std::vector<int64_t> buckets, buffer_flats;
  if (!ddp_init(ledger, in, o, numels, buckets, buffer_flats)) return out;
  ledger.point("init");

  ModelTrace zero_first, zero_later;
  if (o.zero_redundancy) std::tie(zero_first, zero_later) = zero_redundancy_steps(in, o);

  const std::vector<int64_t> rebuilt = ddp_bucket_bytes(numels, o.bucket_cap_bytes);
  const spec::UnitPartition part =
      whole_model_unit(std::max(trace_modules(*in.no_grads), trace_modules(*in.with_grads)));
  std::string label;
  std::vector<int64_t> grads;  // .grad storages outside the buckets (the default mode)
  // What the previous forward returned beside the loss, held by the loop's
  // `outputs` until the next forward returns (none when it returns the loss).
  std::vector<int64_t> outputs, previous_outputs;
  for (int k = 1; k <= o.steps; ++k) {
    const std::string step = "step" + std::to_string(k);
    // opt.zero_grad(): what it allocates itself (traced), then, with
    // set_to_none=True, every .grad dropped (with gradient_as_bucket_view
    // they are views of the buckets: nothing freed); with set_to_none=False
    // (PyTorch < 2.0's default) each .grad zeroed in place: they stay.
    if (in.zero_grad &&
        !replay(*in.zero_grad, ledger, step + "/forward", Category::kTemporaries, Category::kTemporaries))
      return out;
    if (o.zero_grad_set_to_none) ledger.free_all(grads);
    // Forward, loss and backward. With no .grad (first step, or after
    // set_to_none) in the default mode, AccumulateGrad keeps the gradient
    // each op made as .grad; the reducer's hook copies it into its bucket
    // (in place: reducer.cpp mark_variable_ready_dense, `bucket_view.copy_(
    // grad)` / mul_out) and after the all-reduce copies the bucket back into
    // it: the no-grads trace, its gradients kept. With every .grad present
    // (they stayed), or with gradient_as_bucket_view (the hook points .grad
    // at the bucket's view, dropping the op's gradient right after
    // AccumulateGrad took it), each op's gradient is freed once accumulated:
    // the with-grads trace.
    // With --grad-accum N the loop runs N micro-batches under DDP.no_sync()
    // but the last (distributed.py 1.13): the reducer expects no autograd
    // hook (reducer.cpp autograd_hook returns at once), so .grad accumulates
    // as without DDP, and only the last micro-batch's backward reduces; the
    // buffers are broadcast before a forward only when the one before it
    // synced (will_sync_module_buffers: require_forward_param_sync is set
    // False by a no_sync forward), so before each step's first micro-batch.
    for (int m = 1; m <= o.grad_accum; ++m) {
      const std::string micro = o.grad_accum == 1 ? step : step + "." + std::to_string(m);
      const bool grads_exist = !grads.empty();
      // static_graph's first synced iteration: gradients reduced as the
      // backward ends, so bucket views replace .grad only then.
      const bool first_static = o.static_graph && k == 1 && m == o.grad_accum;
      const bool views = o.gradient_as_bucket_view && !first_static;
      const ModelTrace& fb = (views || grads_exist) ? *in.with_grads : *in.no_grads;
      StepHooks hooks;
      bool model_called = false;
      hooks.pre_forward = [&](int) {
        // DDP.forward: in the second iteration the buckets are rebuilt
        // (Reducer::rebuild_buckets, once the first synced backward has
        // recorded the gradients' order: sync_bucket_indices' four int32
        // tensors, then initialize_buckets frees the old buckets and makes
        // the new), then the buffers are broadcast.
        if (model_called) return;
        model_called = true;
        if (o.wrapped && k == 2 && m == 1) {
          std::vector<int64_t> sync;
          if (!alloc_each(ledger, Category::kCommBuffers, ddp_rebuild_sync_tensors(numels, rebuilt.size()), label,
                          &sync))
            return;
          ledger.free_all(sync);
          ledger.free_all(buckets);
          if (!alloc_each(ledger, Category::kCommBuffers, rebuilt, label, &buckets)) return;
        }
        if (m == 1) broadcast(ledger, buffer_flats, label);
      };
      if (first_static)
        hooks.forward_returns = [&] {
          // _DDPSink: a clone of each returned tensor; the originals (what
          // the loop would hold) go as DDP.forward returns.
          std::vector<int64_t> clones;
          if (!alloc_each(ledger, Category::kActivations, fb.output_tensor_bytes, label, &clones)) return;
          ledger.free_all(outputs);
          outputs = std::move(clones);
        };
      // scaler.scale(loss), first call: its scale and growth tracker.
      if (o.grad_scaler && k == 1 && m == 1) hooks.backward_begins = [&] { grad_scaler_init(ledger, label); };
      label = micro + "/forward";
      std::vector<std::vector<int64_t>> unit_grads{std::move(grads)};
      const bool ok =
          walk_pytorch_step(fb, part, {}, micro, label, hooks, ledger, unit_grads, outputs, previous_outputs);
      grads = std::move(unit_grads[0]);
      if (!ok) return out;
      previous_outputs.swap(outputs);
      if (first_static && o.gradient_as_bucket_view) ledger.free_all(grads);  // delay_all_reduce: now views
      if (m < o.grad_accum) ledger.point(micro + "/backward");
    }
    if (o.gradient_as_bucket_view) grads.clear();  // views of the buckets (no storage of their own)
    ledger.point((o.grad_accum == 1 ? step : step + "." + std::to_string(o.grad_accum)) + "/backward");
    // opt.step(): torch.optim.AdamW, traced: step 1 creates its state.
    const ModelTrace& opt = o.zero_redundancy ? (k == 1 ? zero_first : zero_later)
                                              : (k == 1 ? *in.optimizer_first : *in.optimizer_later);
    if (!optimizer_step(ledger, step, &opt, o.grad_scaler, false)) return out;
  }
  ledger.finish();
  return out;
}

}  // namespace shardfit::planner
