#include "planner/plan_builder.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "models/module_table.h"
#include "planner/batch_search.h"
#include "planner/plan_request_checks.h"
#include "planner/time_model.h"
#include "planner/trace.h"
#include "spec/grad_buckets.h"
#include "spec/job.h"
#include "spec/recompute.h"
#include "spec/schedule.h"
#include "spec/shard_layout.h"
#include "spec/strategy.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

MemoryBreakdown to_breakdown(const CategoryBytes& c) {
  MemoryBreakdown b;
  b.params_bytes = c[static_cast<int>(Category::kParams)];
  b.grads_bytes = c[static_cast<int>(Category::kGrads)];
  b.optimizer_bytes = c[static_cast<int>(Category::kOptimizer)];
  b.activations_bytes = c[static_cast<int>(Category::kActivations)];
  b.comm_buffers_bytes = c[static_cast<int>(Category::kCommBuffers)];
  b.temporaries_bytes = c[static_cast<int>(Category::kTemporaries)];
  b.overhead_bytes = c[static_cast<int>(Category::kOverhead)];
  return b;
}

void set_step_time(PlanCandidate& pc, const StepTime& st) {
  pc.predicted.step_time_s = st.step_time_s;
  pc.predicted.tokens_per_s = st.tokens_per_s;
  pc.predicted.compute_s = st.compute_s;
  pc.predicted.comm_s = st.comm_s;
  pc.predicted.exposed_comm_s = st.exposed_comm_s;
  pc.predicted.offload_s = st.offload_s;
  pc.predicted.optimizer_s = st.optimizer_s;
}

void set_limit(PlanCandidate& pc, const StepSimResult& stop, int64_t batch) {
  pc.limit = std::string(category_name(stop.oom_category)) + " in " + stop.oom_label;
  pc.oom = PlanCandidate::Oom{batch,
                              stop.oom_label,
                              stop.oom_request_bytes,
                              stop.oom_allocation_bytes,
                              stop.oom_allocated_bytes,
                              stop.oom_reserved_bytes};
}

// The intra-op threads `shardfit run` gives each of a CPU plan's ranks when
// they all run on this host, as validate runs them (launch/run.cc).
int cpu_rank_threads(int world) {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(std::max(1, world))));
}

namespace detail {

// A model's traces for one (precision, recomputed modules) pair at every batch:
// exact at batch 1, affine from batches 2 and 3 beyond — or, where the
// trace is not batch-affine (CPU bf16: oneDNN's scratchpads are blocked by
// K = tokens; a chunked loss: its chunk count), traced exactly at every
// batch asked for.
class BatchTraces {
 public:
  BatchTraces(ModelTrace at1, ModelTrace at2, const ModelTrace& at3)
      : at1_(std::move(at1)), affine_(std::make_unique<AffineTrace>(std::move(at2), at3)) {}
  BatchTraces(ModelTrace at1, std::function<ModelTrace(int64_t)> exact)
      : at1_(std::move(at1)), exact_(std::move(exact)) {}
  ModelTrace at(int64_t batch) const {
    if (batch == 1) return at1_;
    return affine_ ? affine_->at(batch) : exact_at(batch);
  }
  const ModelTrace& at1() const { return at1_; }
  const AffineTrace* affine() const { return affine_.get(); }
  // Forward and backward FLOPs at `batch`. Batch 1's trace records none
  // (TraceOptions::record_ops): from the affine traces, or traced again.
  std::pair<double, double> flops_at(int64_t batch) const {
    if (affine_) return affine_->flops_at(batch);
    const ModelTrace t = exact_at(batch);
    return {t.forward_flops, t.backward_flops};
  }
  // The same phases' work by op (PhaseWork), for the time model.
  std::pair<PhaseWork, PhaseWork> work_at(int64_t batch) const {
    if (affine_) return affine_->work_at(batch);
    const ModelTrace t = exact_at(batch);
    return {t.forward_work, t.backward_work};
  }
  ModelTrace exact_at(int64_t batch) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exact_cache_.find(batch);
    if (it == exact_cache_.end()) it = exact_cache_.emplace(batch, exact_(batch)).first;
    return it->second;
  }

 private:
  ModelTrace at1_;
  std::unique_ptr<AffineTrace> affine_;
  std::function<ModelTrace(int64_t)> exact_;
  mutable std::mutex mu_;
  mutable std::map<int64_t, ModelTrace> exact_cache_;
};

}  // namespace detail

// A sweep's shared traces (PlanRequest::trace_cache): recorded by the first
// plan that needs them, read by the rest.
struct TraceCache {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const detail::BatchTraces>> traces;
};

std::shared_ptr<TraceCache> make_trace_cache() { return std::make_shared<TraceCache>(); }

namespace {

using detail::BatchTraces;


// The precisions a sweep tries: what the device computes in, and with
// `--attention flash` only fp16 and bf16 (the kernel takes nothing else).
std::vector<Precision> supported(const DeviceProfile& p, const models::ModelConfig& m) {
  std::vector<Precision> out;
  for (Precision x : {Precision::kFp32, Precision::kFp16, Precision::kBf16})
    if (p.supports(compute_dtype(x)) && !(m.flash_attention && x == Precision::kFp32)) out.push_back(x);
  return out;
}

// The model as it runs on `p`: `--attention flash` needs a CUDA device of
// compute capability 8.0 or later (flash_api.cpp: "FlashAttention only
// supports Ampere GPUs or newer"), and its trace needs the SM count, as
// does `--attention sdpa` where it resolves to flash (model_for).
models::ModelConfig model_on_device(const models::ModelConfig& m, const DeviceProfile& p) {
  models::ModelConfig out = m;
  if (m.sdpa_attention && p.kind == DeviceKind::kCuda) out.flash_sm_count = std::max<int64_t>(0, p.sm_count);
  if (!m.flash_attention) return out;
  const std::string why = "--attention flash: PyTorch's flash kernel runs on CUDA GPUs of compute capability 8.0 or later; ";
  if (p.kind != DeviceKind::kCuda) throw std::invalid_argument(why + p.name + " is not a CUDA device");
  if (p.compute_capability < 8.0) {
    char cc[32];
    std::snprintf(cc, sizeof(cc), "%.1f", p.compute_capability);
    throw std::invalid_argument(why + p.name + (p.compute_capability > 0 ? std::string(" is ") + cc
                                                                          : std::string(" gives no compute_capability")));
  }
  if (p.sm_count <= 0) throw std::invalid_argument(why + "profile " + p.name + " gives no sm_count");
  out.flash_sm_count = p.sm_count;
  return out;
}

// The model as a candidate computing in `dtype` runs it on `p`: `--attention
// sdpa` resolved to the kernel PyTorch picks there (models::resolve_sdpa).
models::ModelConfig model_for(const models::ModelConfig& m, const DeviceProfile& p, DType dtype) {
  return models::resolve_sdpa(m, p.kind == DeviceKind::kCuda, p.compute_capability, dtype != DType::kF32);
}

// Simulates one candidate's unit partition at any batch, re-sizing one
// simulator instead of re-indexing a trace per batch tried.
class BatchSimulator {
 public:
  BatchSimulator(const BatchTraces& traces, const UnitPartition& units)
      : traces_(traces), units_(units), at1_(traces.at1(), units) {
    if (traces.affine()) at_n_ = std::make_unique<StepSimulator>(traces.affine()->base(), units);
  }
  StepSimResult simulate(int64_t batch, const Strategy& s, AllocatorModel& alloc, const SimOptions& o) {
    alloc.reset();
    if (batch == 1) return at1_.simulate(s, alloc, o);
    if (!at_n_) {
      auto it = exact_.find(batch);
      if (it == exact_.end())
        it = exact_.emplace(batch, std::make_unique<StepSimulator>(traces_.exact_at(batch), units_)).first;
      return it->second->simulate(s, alloc, o);
    }
    if (batch != sized_for_) {
      at_n_->set_alloc_bytes(traces_.affine()->alloc_bytes(batch));
      sized_for_ = batch;
    }
    return at_n_->simulate(s, alloc, o);
  }
  const std::vector<int>& forward_order() const { return at1_.forward_order(); }

 private:
  const BatchTraces& traces_;
  const UnitPartition& units_;
  StepSimulator at1_;
  std::unique_ptr<StepSimulator> at_n_;
  std::map<int64_t, std::unique_ptr<StepSimulator>> exact_;
  int64_t sized_for_ = 2;
};

// fp16 and bf16 allocate the same bytes on CUDA: one trace serves both. On
// the CPU bf16 matmuls add oneDNN scratchpads (trace.h).
DType trace_dtype(DType dtype, bool cuda) { return dtype == DType::kBF16 && cuda ? DType::kF16 : dtype; }

std::string trace_key(DType dtype, bool cuda, const std::vector<int>& recompute) {
  std::string key = std::to_string(static_cast<int>(trace_dtype(dtype, cuda))) + ":";
  for (int m : recompute) key += std::to_string(m) + ",";
  return key;
}

class TraceSource {
 public:
  TraceSource(const models::ModelConfig& m, const DeviceProfile& profile, int64_t seq, int world,
              std::shared_ptr<const TraceFile> file)
      : model_(m),
        profile_(profile),
        seq_(seq),
        cuda_(profile.kind == DeviceKind::kCuda),
        world_(world),
        file_(std::move(file)) {}
  // Whether a trace for (dtype, recompute) exists: always for a built-in
  // model (it is traced), for a trace file when the file has it.
  bool has(DType dtype, const std::vector<int>& recompute) const {
    return !file_ || file_->find(dtype, recompute, 1);
  }
  // The traces for (dtype, recompute), recorded on the calling thread (or
  // read from the file). Any number of threads may record at once
  // (trace_recorder.h).
  std::unique_ptr<BatchTraces> record(DType dtype, const std::vector<int>& recompute) const {
    if (file_) return from_file(dtype, recompute);
    TraceOptions o;
    o.seq_len = seq_;
    o.dtype = trace_dtype(dtype, cuda_);
    o.recompute_modules = recompute;
    o.target_cuda = cuda_;
    o.cpu_threads = cpu_rank_threads(world_);
    o.batch = 1;
    o.record_ops = false;  // batch 1's FLOPs are never asked for (see TraceOptions)
    const models::ModelConfig model = model_for(model_, profile_, dtype);
    ModelTrace t1 = trace_step(model, o);
    o.record_ops = true;
    // A chunked loss runs ceil(tokens / N) chunks: its events are not affine in batch either.
    if ((!cuda_ && o.dtype == DType::kBF16) || model.loss_chunk > 0) {
      return std::make_unique<BatchTraces>(std::move(t1), [model, o](int64_t batch) {
        TraceOptions ob = o;
        ob.batch = batch;
        return trace_step(model, ob);
      });
    }
    // Batches 2 and 3 with the op observer: the time model's matrix
    // product shapes (PhaseWork) are affine in the batch, not proportional.
    o.batch = 2;
    ModelTrace t2 = trace_step(model, o);
    o.batch = 3;
    ModelTrace t3 = trace_step(model, o);
    return std::make_unique<BatchTraces>(std::move(t1), std::move(t2), t3);
  }

 private:
  // The file's traces at batches 1, 2 and 3, with its module table.
  std::unique_ptr<BatchTraces> from_file(DType dtype, const std::vector<int>& recompute) const {
    ModelTrace at[3];
    for (int64_t b = 1; b <= 3; ++b) {
      const ModelTrace* t = file_->find(dtype, recompute, b);
      if (!t)
        throw std::invalid_argument("--trace: the file has no " + std::string(dtype_name(dtype)) +
                                    " trace at batch " + std::to_string(b) + " (the planner needs 1, 2 and 3)");
      at[b - 1] = *t;
      at[b - 1].modules = file_->modules;
    }
    return std::make_unique<BatchTraces>(std::move(at[0]), std::move(at[1]), at[2]);
  }

  models::ModelConfig model_;
  DeviceProfile profile_;
  int64_t seq_;
  bool cuda_;
  int world_;
  std::shared_ptr<const TraceFile> file_;
};

// What the simulator and the time model are given for candidate `c` of
// request `r`, from its traits (decoded, and so validated, once).
Strategy strategy_for(const Candidate& c, const PlanRequest& r) {
  const int world = r.gpus_per_node * r.nodes;
  const spec::StrategyTraits t =
      spec::decode_strategy(c, world, spec::shard_group_for(c.sharding, world, r.gpus_per_node), r.optimizer);
  Strategy s;
  s.sharding = c.sharding;
  s.offload = t.offload;
  s.recompute = t.recompute;
  s.compute_dtype = t.compute_dtype;
  s.optimizer = r.optimizer;
  s.world_size = world;
  s.shard_group_size = t.shard_group_size;
  s.grad_accum = r.grad_accum;
  s.schedule = r.schedule;
  return s;
}

// The time model's inputs besides the trace's FLOPs: units in forward order,
// each padded to the group its ring collective spans.
StepTimeInputs time_inputs(const Candidate& c, const PlanRequest& r, const UnitPartition& units,
                           const std::vector<int>& forward_order, int64_t batch) {
  const spec::StrategyTraits t = strategy_for(c, r).traits();
  StepTimeInputs ti;
  ti.candidate = c;
  for (int u : forward_order) ti.unit_padded_numel.push_back(spec::padded_numel(units.units[u].numel, t.collective_group_size));
  if (!t.shard_grads) {
    std::vector<spec::FlatParamLayout> layouts;
    for (const spec::Unit& u : units.units) layouts.emplace_back(u.params, t.shard_group_size);
    ti.grad_bucket_numel = spec::GradBuckets(layouts, static_cast<int>(dtype_bytes(t.compute_dtype)),
                                             r.schedule.ddp_bucket_cap_bytes)
                               .numels();
  }
  ti.batch = batch;
  ti.grad_accum = r.grad_accum;
  ti.seq_len = r.seq_len;
  ti.world_size = t.world_size;
  ti.shard_group_size = t.collective_group_size;
  ti.nodes = r.nodes;
  ti.optimizer_states = t.optimizer_states;
  ti.schedule = r.schedule;
  // CPU ranks run Gloo (executor/comm.h's GlooAllGather::kViaAllReduce, the default).
  ti.gathers_via_all_reduce = r.profile.kind == DeviceKind::kCpu;
  return ti;
}

// What the caching allocator may reserve: the device's memory less the
// profile's fixed overheads (NCCL's buffers only where the job opens a
// communicator); unlimited without a memory figure.
int64_t allocator_budget(const PlanRequest& r, int64_t device_mem, int world) {
  return device_mem > 0 ? r.profile.allocator_budget_bytes(device_mem, r.nccl_communicator ? world : 1)
                        : kUnlimitedBytes;
}

// What the sweep's candidates need: each one's units (partitions holds
// them, one per wrap policy) and recomputed modules, and the distinct traces,
// first need first. Candidates a trace file has no trace for are left out.
struct TraceNeeds {
  std::vector<Candidate> kept;
  std::vector<const UnitPartition*> units_of;  // by kept candidate
  std::vector<std::vector<int>> ckpts;         // by kept candidate
  std::vector<std::string> keys;               // distinct trace keys
  std::vector<size_t> key_of;                  // by kept candidate: index into keys
};
TraceNeeds trace_needs(const std::vector<Candidate>& candidates, const std::vector<ModuleNode>& modules,
                       const TraceSource& traces, bool cuda, std::map<std::string, UnitPartition>& partitions) {
  TraceNeeds n;
  for (const Candidate& c : candidates) {
    auto pit = partitions.find(c.wrap);
    if (pit == partitions.end())
      pit = partitions.emplace(c.wrap, wrap_modules(modules, WrapPolicy::parse(c.wrap))).first;
    std::vector<int> ckpt = c.recompute ? spec::recompute_modules(modules, pit->second) : std::vector<int>{};
    if (!traces.has(compute_dtype(c.precision), ckpt)) continue;
    const std::string key = trace_key(compute_dtype(c.precision), cuda, ckpt);
    const auto kit = std::find(n.keys.begin(), n.keys.end(), key);
    n.key_of.push_back(static_cast<size_t>(kit - n.keys.begin()));
    if (kit == n.keys.end()) n.keys.push_back(key);
    n.units_of.push_back(&pit->second);
    n.ckpts.push_back(std::move(ckpt));
    n.kept.push_back(c);
  }
  if (n.kept.empty())
    throw std::invalid_argument("--trace: the file has no trace for any candidate left by the filters");
  return n;
}

// The candidates `plan` sweeps: the request's filters, the precisions the
// device (and a trace file) can run.
std::vector<Candidate> plan_candidates(const PlanRequest& r, const models::ModelConfig& model,
                                       const TraceFile* file) {
  CandidateOptions copts = r.candidates;
  copts.supported_precisions = supported(r.profile, model);
  if (file) {  // only what the file has traces for
    const std::vector<DType> traced = file->dtypes();
    std::vector<Precision> kept;
    for (Precision x : copts.supported_precisions)
      if (std::find(traced.begin(), traced.end(), compute_dtype(x)) != traced.end()) kept.push_back(x);
    copts.supported_precisions = kept;
  }
  copts.device_name = r.profile.name + (model.flash_attention ? " with --attention flash" : "") +
                      (file ? " with this trace file (a precision needs its traces: bf16 from trace_recorder.py "
                              "--param-dtype bf16)"
                            : "");
  copts.nodes = r.nodes;
  return enumerate_candidates(copts);
}

}  // namespace

Plan plan_skeleton(const PlanRequest& r, const TraceFile* file, int64_t device_mem, int64_t budget) {
  Plan plan;
  if (file)  // the loss and the attention are whatever the traced forward does
    plan.model = {file->model_name, file->param_count(), r.seq_len, "traced", "traced", file->block_class()};
  else
    plan.model = {r.model.name, r.model.param_count(), r.seq_len, models::loss_name(r.model),
                  models::attention_name(r.model)};
  plan.hardware.profile = r.profile.name;
  plan.hardware.device_mem_bytes = device_mem;
  if (device_mem > 0 && budget < device_mem) plan.hardware.allocator_budget_bytes = budget;
  plan.hardware.gpus_per_node = r.gpus_per_node;
  plan.hardware.nodes = r.nodes;
  plan.optimizer = r.optimizer == Optimizer::kAdamW ? "adamw" : "sgd";
  plan.objective = r.objective;
  plan.grad_accum = r.grad_accum;
  plan.schedule = r.schedule;
  return plan;
}

void set_fit(PlanCandidate& pc, const StepSimResult& fit) {
  pc.predicted.peak_allocated_bytes = fit.peak_allocated_bytes;
  pc.predicted.peak_reserved_bytes = fit.peak_reserved_bytes;
  pc.predicted.breakdown = to_breakdown(fit.peak_breakdown_bytes);
  pc.predicted.peak_host_bytes = fit.peak_host_bytes;
}

bool set_search_capped(PlanCandidate& pc, int64_t max_batch) {
  if (pc.max_batch_per_gpu < max_batch) return false;
  pc.limit = "no memory limit (search capped at batch " + std::to_string(max_batch) + ")";
  return true;
}

namespace {

// One candidate's batch search at its units: the largest batch whose
// simulated step fits `budget`, the prediction there, what stops the next
// batch, and the step time. Each batch is simulated once per allocator model.
PlanCandidate search_candidate(const Candidate& c, const PlanRequest& r, int64_t budget, const UnitPartition& units,
                               const BatchTraces& trace, BatchSimulator& sim, const SimOptions& no_timeline,
                               ExactAllocator& exact_alloc, CudaCachingAllocatorModel& cuda_alloc) {
  const Strategy s = strategy_for(c, r);
  const bool cuda_allocator = r.profile.allocator == AllocatorKind::kCudaCaching;
  // Each batch simulated once per allocator model: the search, the fit and
  // the batch after it ask for some of the same.
  std::map<std::pair<int64_t, bool>, StepSimResult> simulated_at;
  auto simulate = [&](int64_t batch, bool cuda_model) -> const StepSimResult& {
    auto it = simulated_at.find({batch, cuda_model});
    if (it != simulated_at.end()) return it->second;
    AllocatorModel& alloc = cuda_model ? static_cast<AllocatorModel&>(cuda_alloc) : exact_alloc;
    return simulated_at.emplace(std::make_pair(batch, cuda_model), sim.simulate(batch, s, alloc, no_timeline))
        .first->second;
  };
  // Where to start the search: where the exact allocator's peak, affine in
  // the batch from 2 on (each storage is, batch_search.h; the peak, a max of
  // them, may bend up), meets the budget.
  int64_t guess = 1;
  if (r.max_batch >= 3 && !simulate(2, false).oom) {
    const StepSimResult& at2 = simulate(2, false);
    const StepSimResult& at3 = simulate(3, false);
    const int64_t slope = at3.peak_allocated_bytes - at2.peak_allocated_bytes;
    const int64_t more = at3.oom || slope <= 0 ? 0 : (budget - at3.peak_allocated_bytes) / slope;
    guess = at3.oom ? 2 : slope <= 0 || more >= r.max_batch ? r.max_batch : 3 + more;
  }

  PlanCandidate pc;
  pc.candidate = c;
  pc.units = static_cast<int>(units.units.size());
  // The exact allocator's answer bounds the caching allocator's from above
  // (reserved ≥ allocated) and costs a fraction: search with it, then step
  // down with the caching-allocator model only as far as it needs.
  pc.max_batch_per_gpu =
      search_max_batch_from([&](int64_t b) { return !simulate(b, false).oom; }, guess, r.max_batch);
  if (cuda_allocator && pc.max_batch_per_gpu < r.max_batch)
    pc.max_batch_per_gpu =
        search_max_batch_below([&](int64_t b) { return !simulate(b, true).oom; }, pc.max_batch_per_gpu);
  const int64_t at = std::max<int64_t>(pc.max_batch_per_gpu, 1);
  const StepSimResult& fit = simulate(at, cuda_allocator);
  if (pc.max_batch_per_gpu > 0) {
    set_fit(pc, fit);
  } else {  // what batch 1 needs: its step with no memory limit
    ExactAllocator unlimited_exact;
    CudaCachingAllocatorModel unlimited_cuda;
    set_fit(pc, sim.simulate(1, s, cuda_allocator ? static_cast<AllocatorModel&>(unlimited_cuda) : unlimited_exact,
                             no_timeline));
  }
  if (!set_search_capped(pc, r.max_batch)) {
    const StepSimResult& next = pc.max_batch_per_gpu > 0 ? simulate(pc.max_batch_per_gpu + 1, cuda_allocator) : fit;
    set_limit(pc, next, pc.max_batch_per_gpu + 1);
  }
  if (pc.max_batch_per_gpu > 0) {
    StepTimeInputs ti = time_inputs(c, r, units, sim.forward_order(), pc.max_batch_per_gpu);
    std::tie(ti.forward_flops, ti.backward_flops) = trace.flops_at(pc.max_batch_per_gpu);
    std::tie(ti.forward_work, ti.backward_work) = trace.work_at(pc.max_batch_per_gpu);
    set_step_time(pc, estimate_step_time(ti, r.profile));
  }
  return pc;
}

}  // namespace

Plan build_plan(const PlanRequest& r) {
  check_request(r);
  const TraceFile* file = r.trace_file.get();
  const int world = r.gpus_per_node * r.nodes;
  const bool cuda = r.profile.kind == DeviceKind::kCuda;
  const int64_t device_mem = r.device_mem_bytes > 0 ? r.device_mem_bytes : r.profile.memory_bytes;
  const int64_t budget = allocator_budget(r, device_mem, world);
  if (r.stack == Stack::kPytorch) return build_pytorch_plan(r, budget, device_mem);

  const models::ModelConfig model = file ? r.model : model_on_device(r.model, r.profile);
  std::vector<Candidate> candidates = plan_candidates(r, model, file);

  check_cpu_bf16_budget(candidates, cuda, file, device_mem, r.max_batch);

  Plan plan = plan_skeleton(r, file, device_mem, budget);

  const std::vector<ModuleNode> modules = file ? file->modules : models::module_table(r.model);
  const TraceSource traces(model, r.profile, r.seq_len, world, r.trace_file);
  SimOptions sim_options;
  if (cuda && r.profile.cublas_workspace_bytes > 0) sim_options.overhead_bytes = r.profile.cublas_workspace_allocations;

  SimOptions no_timeline = sim_options;
  no_timeline.record_timeline = false;

  // Each candidate's units and the trace it needs; the traces in the order
  // the sweep first needs them.
  std::map<std::string, UnitPartition> partitions;
  const TraceNeeds needs = trace_needs(candidates, modules, traces, cuda, partitions);
  candidates = needs.kept;
  const std::vector<const UnitPartition*>& units_of = needs.units_of;
  const std::vector<std::vector<int>>& ckpts = needs.ckpts;
  const std::vector<std::string>& keys = needs.keys;
  const std::vector<size_t>& key_of = needs.key_of;

  // A pipeline on every core: a worker records the next trace not yet
  // taken (each thread its own recording, trace_recorder.h) or, when every
  // trace is taken, simulates a candidate whose trace exists, with its own
  // simulators and allocator models (they keep state between batches).
  plan.candidates.resize(candidates.size());
  std::vector<std::shared_ptr<const BatchTraces>> traced(keys.size());
  std::vector<const BatchTraces*> trace_of(candidates.size(), nullptr);
  std::mutex mu;  // guards everything below and the progress callback
  std::condition_variable cv;
  std::deque<size_t> queue;  // candidates whose trace exists, not yet taken
  size_t next_key = 0, keys_done = 0;
  bool failed = false;
  size_t simulated = 0;
  auto progress = [&](const char* stage, size_t done, size_t total, const std::string& label) {
    if (r.on_progress) r.on_progress(stage, done, total, label);
  };
  auto evaluate_candidate = [&](size_t ci, std::map<std::string, std::unique_ptr<BatchSimulator>>& simulators,
                                ExactAllocator& exact_alloc, CudaCachingAllocatorModel& cuda_alloc) {
    const Candidate& c = candidates[ci];
    const UnitPartition& units = *units_of[ci];
    const BatchTraces& trace = *trace_of[ci];
    const std::string sim_key = keys[key_of[ci]] + "|" + c.wrap;
    auto sit = simulators.find(sim_key);
    if (sit == simulators.end())
      sit = simulators.emplace(sim_key, std::make_unique<BatchSimulator>(trace, units)).first;
    BatchSimulator& sim = *sit->second;
    plan.candidates[ci] = search_candidate(c, r, budget, units, trace, sim, no_timeline, exact_alloc, cuda_alloc);
    if (!file)  // --attention sdpa differs per candidate: record what each runs
      plan.candidates[ci].attention = models::attention_name(model_for(model, r.profile, compute_dtype(c.precision)));
    const std::lock_guard<std::mutex> lock(mu);
    progress("simulate", ++simulated, candidates.size(), c.to_id());
  };
  // Records trace `k` and queues the candidates that use it.
  auto record = [&](size_t k) {
    size_t first = 0;
    while (key_of[first] != k) ++first;
    // A sweep's other plans may have recorded it: the same model, sequence
    // length, kernels and (on a CPU) threads per rank.
    const std::string shared_key = std::to_string(r.seq_len) + ":" + std::to_string(cpu_rank_threads(world)) + ":" +
                                   keys[k];
    std::shared_ptr<const BatchTraces> t;
    if (r.trace_cache) {
      const std::lock_guard<std::mutex> lock(r.trace_cache->mu);
      if (auto it = r.trace_cache->traces.find(shared_key); it != r.trace_cache->traces.end()) t = it->second;
    }
    if (!t) {
      t = traces.record(compute_dtype(candidates[first].precision), ckpts[first]);
      if (r.trace_cache) {
        const std::lock_guard<std::mutex> lock(r.trace_cache->mu);
        r.trace_cache->traces.emplace(shared_key, t);
      }
    }
    const std::lock_guard<std::mutex> lock(mu);
    traced[k] = std::move(t);
    for (size_t ci = 0; ci < candidates.size(); ++ci)
      if (key_of[ci] == k) {
        trace_of[ci] = traced[k].get();
        queue.push_back(ci);
      }
    progress("trace", ++keys_done, keys.size(),
             std::string(precision_name(candidates[first].precision)) +
                 (candidates[first].recompute ? " with recompute" : ""));
    cv.notify_all();
  };
  auto work = [&] {
    std::map<std::string, std::unique_ptr<BatchSimulator>> simulators;
    ExactAllocator exact_alloc(budget);
    CudaCachingAllocatorModel cuda_alloc(budget);
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      // Done when nothing is queued, no trace is left to take and none is
      // being recorded (it would queue more).
      cv.wait(lock, [&] { return failed || !queue.empty() || next_key < keys.size() || keys_done == keys.size(); });
      if (failed) return;
      if (next_key < keys.size()) {
        const size_t k = next_key++;
        lock.unlock();
        record(k);
      } else if (!queue.empty()) {
        const size_t ci = queue.front();
        queue.pop_front();
        lock.unlock();
        evaluate_candidate(ci, simulators, exact_alloc, cuda_alloc);
      } else {
        return;
      }
    }
  };
  std::vector<std::exception_ptr> errors;
  auto guarded = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mu);
      errors.push_back(std::current_exception());
      failed = true;
      cv.notify_all();
    }
  };
  const size_t workers = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), 4);
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back([&] { guarded(work); });
  guarded(work);
  for (auto& t : threads) t.join();
  if (!errors.empty()) std::rethrow_exception(errors.front());
  if (auto best = choose(plan.candidates, r.objective)) plan.chosen = plan.candidates[*best].id();
  return plan;
}

CandidatePrediction predict_candidate(const PlanRequest& r, const Candidate& c, int64_t batch, int steps) {
  if (batch < 1) throw std::invalid_argument("batch " + std::to_string(batch) + ": must be at least 1");
  const int world = r.gpus_per_node * r.nodes;
  const bool cuda = r.profile.kind == DeviceKind::kCuda;
  const int64_t device_mem = r.device_mem_bytes > 0 ? r.device_mem_bytes : r.profile.memory_bytes;
  const int64_t budget = allocator_budget(r, device_mem, world);
  if (r.trace_file)
    throw std::invalid_argument("--trace: a traced model is planned, not run by shardfit's engine");
  const Strategy s = strategy_for(c, r);  // validates c for this world
  const std::vector<ModuleNode> modules = models::module_table(r.model);
  const UnitPartition units = wrap_modules(modules, WrapPolicy::parse(c.wrap));
  TraceOptions o;
  o.batch = batch;
  o.seq_len = r.seq_len;
  o.dtype = compute_dtype(c.precision);
  o.target_cuda = cuda;
  o.cpu_threads = cpu_rank_threads(world);
  if (c.recompute) o.recompute_modules = spec::recompute_modules(modules, units);
  if (r.model.flash_attention && c.precision == Precision::kFp32)
    throw std::invalid_argument("--attention flash: the flash kernel takes fp16 or bf16, not " + c.to_id());
  const ModelTrace trace = trace_step(model_for(model_on_device(r.model, r.profile), r.profile, o.dtype), o);

  SimOptions so;
  so.steps = steps;
  if (cuda && r.profile.cublas_workspace_bytes > 0) so.overhead_bytes = r.profile.cublas_workspace_allocations;
  const StepSimulator sim(trace, units);
  std::unique_ptr<AllocatorModel> alloc;
  if (r.profile.allocator == AllocatorKind::kExact)
    alloc = std::make_unique<ExactAllocator>(budget);
  else
    alloc = std::make_unique<CudaCachingAllocatorModel>(budget);

  CandidatePrediction out;
  out.sim = sim.simulate(s, *alloc, so);
  out.units = static_cast<int>(units.units.size());
  if (!out.sim.oom) {
    StepTimeInputs ti = time_inputs(c, r, units, sim.forward_order(), batch);
    ti.forward_flops = trace.forward_flops;
    ti.backward_flops = trace.backward_flops;
    ti.forward_work = trace.forward_work;
    ti.backward_work = trace.backward_work;
    const StepTime st = estimate_step_time(ti, r.profile);
    out.step_time_s = st.step_time_s;
    out.tokens_per_s = st.tokens_per_s;
  }
  return out;
}

}  // namespace shardfit::planner
