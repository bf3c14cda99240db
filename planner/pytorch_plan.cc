#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "planner/batch_search.h"
#include "planner/plan_builder.h"
#include "planner/pytorch_fsdp.h"
#include "planner/pytorch_fsdp2.h"
#include "planner/pytorch_stack.h"
#include "planner/time_model.h"
#include "planner/trace.h"
#include "spec/recompute.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {
namespace {

// The FSDP candidate's units: FSDP1's auto wrap policy (a tied weight
// copied into each unit holding a registration of it), or FSDP2's
// fully_shard on each block and the root (a parameter in one group only).
spec::UnitPartition fsdp_units(const std::vector<ModuleNode>& modules, const Candidate& c, int version) {
  return spec::wrap_modules(modules, WrapPolicy::parse(c.wrap),
                            version == 2 ? spec::TiedParams::kKeepTogether : spec::TiedParams::kCopiedPerUnit);
}

// One step's time by the time model (planner/time_model.h) as PyTorch's own
// stack overlaps it, at `flops` (forward, backward) for `batch`. DDP
// launches each bucket's all-reduce once its last gradient is ready
// (reducer.cpp mark_variable_ready), beside the rest of backward: its
// "units" are the rebuilt buckets (ddp_bucket_bytes, made in the order the
// gradients come, the reverse of parameters(): reversed here, so that the
// last one reduced, with nothing left to hide behind, is the time model's
// first unit), their gradients fp32 (autocast casts inside the forward
// only). ZeroRedundancyOptimizer broadcasts the updated partitions after the
// step (zero1's all-gather). FSDP (1.13) reduce-scatters on its post-backward
// stream beside backward and, with BACKWARD_PRE or BACKWARD_POST, gathers the
// next unit ahead of its backward (prefetch 1); with forward_prefetch
// (FSDP1, --prefetch 2) the next unit ahead of its forward too, else the
// forward's gathers are waited for.
StepTime pytorch_step_time(const Candidate& c, const PlanRequest& r, const TraceFile& file, int world,
                           const AffineTrace& trace, int64_t batch) {
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
  ti.schedule.async_reduce = true;
  if (c.sharding == Sharding::kZero2 || c.sharding == Sharding::kZero3 || c.sharding == Sharding::kHybrid) {
    ti.schedule.async_gather = r.fsdp_backward_prefetch != FsdpBackwardPrefetch::kNone;
    ti.schedule.prefetch = r.schedule.prefetch;  // 2: forward_prefetch (FSDP1)
    if (const auto d = parse_fsdp_reduce_dtype(r.fsdp_reduce_dtype))  // MixedPrecision(Policy)(reduce_dtype=d)
      ti.reduce_elem_bytes = static_cast<int>(dtype_bytes(*d));
    const spec::UnitPartition part = fsdp_units(file.modules, c, r.fsdp_version);
    for (const auto& u : part.units) {
      int64_t padded = fsdp_shard_numel(u.numel, world) * world;  // FSDP1: one flat parameter
      if (r.fsdp_version == 2) {                                  // FSDP2: each parameter on its own
        padded = 0;
        for (const ParamInfo& p : u.params) padded += fsdp2_shard_numel(p, shard_world) * shard_world;
      }
      ti.unit_padded_numel.push_back(padded);
    }
  } else {
    ti.reduce_elem_bytes = 4;
    if (r.single_gpu_unwrapped) {
      ti.unit_padded_numel.push_back(file.param_count());  // no DDP: nothing reduced
    } else {
      const std::vector<int64_t> buckets = ddp_bucket_bytes(file.param_numels(), r.schedule.ddp_bucket_cap_bytes);
      for (auto b = buckets.rbegin(); b != buckets.rend(); ++b) ti.unit_padded_numel.push_back(*b / 4);
    }
  }
  return estimate_step_time(ti, r.profile);
}

}  // namespace

// `--stack pytorch`: PyTorch's DDP with torch.optim.AdamW, or with
// ZeroRedundancyOptimizer(AdamW) (zero1), replayed from the trace file's
// no-grads, with-grads and optimizer traces at each batch
// (planner/pytorch_stack.h): candidates ddp/fp32/wrap=none and
// zero1/fp32/wrap=none (+ckpt too when the file has checkpointed traces).
// With autocast traces, ddp/AMP and zero1/AMP too: bf16 on a CPU, fp16 with
// torch.cuda.amp.GradScaler on CUDA.
// zero1's ranks differ (each its own partition's state): every rank is
// simulated and the largest peak decides. On request (--strategies with the
// full id), PyTorch FSDP (planner/pytorch_fsdp.h): zero2 (SHARD_GRAD_OP) and
// zero3 (FULL_SHARD), +offload or not, wrap=size:N
// (size_based_auto_wrap_policy) or wrap=block (transformer_auto_wrap_policy
// over the trace's block class), on CUDA profiles; fp32, or bf16 as
// MixedPrecision(param_dtype=reduce_dtype=buffer_dtype=torch.bfloat16) from
// the trace file's traces of the model cast to bf16 (--param-dtype bf16).
Plan build_pytorch_plan(const PlanRequest& r, int64_t budget, int64_t device_mem) {
  const TraceFile* file = r.trace_file.get();
  if (!file)
    throw std::invalid_argument("--stack pytorch: needs --trace (a model traced in its own Python process by "
                                "pytorch/trace_recorder.py)");
  const bool cuda = r.profile.kind == DeviceKind::kCuda;
  // (A trace for the other kind of device was refused in build_plan.)
  // The blocks, under torch.utils.checkpoint for +ckpt (what a plan
  // recomputes when nothing but the root is a unit: spec/recompute.h).
  const std::vector<int> blocks =
      spec::recompute_modules(file->modules, wrap_modules(file->modules, WrapPolicy::parse("none")));
  const bool has_ckpt = !blocks.empty() && file->find(DType::kF32, blocks, 1, false, r.ckpt_reentrant);
  // Traces whose forward ran under torch.autocast (trace_recorder.py: bf16
  // for a CPU target, fp16 with GradScaler for a CUDA one): the bf16 / fp16
  // candidates, PyTorch's mixed precision (fp32 parameters, gradients and
  // AdamW).
  const DType amp_dtype = cuda ? DType::kF16 : DType::kBF16;
  const Precision amp = cuda ? Precision::kFp16 : Precision::kBf16;
  const std::string amp_name = spec::precision_name(amp);
  bool has_amp = file->find(amp_dtype, {}, 1, false, false, /*autocast=*/true) != nullptr;
  // Traces of the model cast to bf16 or fp16, not under autocast (CUDA
  // targets only): what FSDP's MixedPrecision(param_dtype=...) computes.
  auto cast_traces = [&](DType d) { return cuda && file->find(d, {}, 1, false, false, /*autocast=*/false); };
  const bool has_mixed = cast_traces(DType::kBF16), has_mixed16 = cast_traces(DType::kF16);
  // The traces a candidate replays, by kind ([0] fp32, [1] fp32 with the
  // blocks checkpointed, [2] the forward under autocast, [3] the model in
  // bf16, [4] in fp16) and grads at start: batch 1 exactly, 2 and 3
  // extended affinely.
  constexpr int kMixed = 3, kMixed16 = 4;
  const ModelTrace* at1[5][2] = {};
  std::unique_ptr<AffineTrace> affine[5][2];
  // Autocast traces whose sizes are not affine in the batch (a CPU bf16
  // matmul's oneDNN scratchpad follows the shapes' blocking, not the batch):
  // no autocast candidates, said once; fp32 plans as before.
  std::string amp_not_affine;
  for (int k = 0; k < 5; ++k) {
    if ((k == 1 && !has_ckpt) || (k == 2 && !has_amp) || (k == kMixed && !has_mixed) ||
        (k == kMixed16 && !has_mixed16))
      continue;
    const DType dtype = k == 2 ? amp_dtype : k == kMixed ? DType::kBF16 : k == kMixed16 ? DType::kF16 : DType::kF32;
    for (int g = 0; g < 2; ++g) {
      const std::vector<int> rec = k == 1 ? blocks : std::vector<int>{};
      const ModelTrace* t[4] = {};
      for (int b = 1; b <= 3; ++b) t[b] = file->find(dtype, rec, b, g == 1, r.ckpt_reentrant && k == 1, k == 2);
      if (!t[1] || !t[2] || !t[3])
        throw std::invalid_argument(std::string("--stack pytorch: the trace file has no ") +
                                    (k == 2         ? "autocast(" + amp_name + ")"
                                     : k == kMixed ? std::string("bf16 (the model cast)")
                                     : k == kMixed16 ? std::string("fp16 (the model cast)")
                                                   : std::string("fp32")) +
                                    " trace" +
                                    (k == 1 ? " with the blocks checkpointed" : "") + " with grads " +
                                    (g == 1 ? "accumulate" : "none") + " at batches 1, 2 and 3");
      at1[k][g] = t[1];
      try {
        affine[k][g] = std::make_unique<AffineTrace>(*t[2], *t[3]);
      } catch (const std::logic_error& e) {
        if (k != 2) throw;  // fp32 and the cast model's traces must be affine
        amp_not_affine = e.what();
      }
    }
  }
  if (!amp_not_affine.empty()) has_amp = false;  // said once the candidates are known (below)
  if (r.ckpt_reentrant && !blocks.empty() && !has_ckpt)
    throw std::invalid_argument("--checkpoint reentrant: the trace file has no traces with use_reentrant=True (record "
                                "it again with pytorch/trace_recorder.py)");
  std::vector<Candidate> candidates;
  // FSDP's candidates: zero2 and zero3; with FSDP2 also hybrid (HSDP).
  auto is_fsdp = [](const Candidate& c) {
    return c.sharding == Sharding::kZero2 || c.sharding == Sharding::kZero3 || c.sharding == Sharding::kHybrid;
  };
  for (const std::string& s : r.candidates.strategies) {
    if (s == "ddp" || s == "zero1") continue;
    const Candidate want = s.find('/') == std::string::npos ? Candidate{} : parse_candidate(s);
    const bool ddp_like = (want.sharding == Sharding::kDdp || want.sharding == Sharding::kZero1) && !want.offload &&
                          want.wrap == "none" &&
                          (want.precision == Precision::kFp32 || (want.precision == amp && !want.recompute));
    const bool fsdp2 = r.fsdp_version == 2;
    const bool fsdp = is_fsdp(want) && (fsdp2 || want.sharding != Sharding::kHybrid) && !want.recompute &&
                      (fsdp2 ? want.wrap == "none" || want.wrap == "block"
                             : want.wrap.rfind("size:", 0) == 0 || want.wrap == "block") &&
                      (want.precision == Precision::kFp32 || want.precision == Precision::kBf16 ||
                       want.precision == Precision::kFp16);
    if (s.find('/') == std::string::npos || !(ddp_like || fsdp))
      throw std::invalid_argument("--strategies " + s + ": --stack pytorch simulates ddp (DistributedDataParallel) "
                                  "and zero1 (with ZeroRedundancyOptimizer), fp32 (+ckpt or not) or autocast (bf16 "
                                  "on a CPU, fp16 with GradScaler on CUDA), wrap=none, and FSDP as zero2 or "
                                  "zero3[+offload]/fp32, bf16 (MixedPrecision) or fp16 (MixedPrecision and "
                                  "ShardedGradScaler)/wrap=size:N or wrap=block "
                                  "(transformer_auto_wrap_policy), with --fsdp-version 2 also hybrid (HSDP) and "
                                  "wrap=block (fully_shard on each block, then the root) or wrap=none (the root "
                                  "only), only in this version");
    if (!fsdp && want.precision == amp && !has_amp)
      throw std::invalid_argument(
          "--strategies " + s +
          (amp_not_affine.empty()
               ? ": the trace file has no traces under torch.autocast(" + amp_name +
                     ") (trace_recorder.py records them: bf16 for --target cpu, fp16 for --target cuda)"
               : ": its autocast traces are not batch-affine, so it cannot be planned in this version (" +
                     amp_not_affine + ")"));
    // FSDP2 runs on CPU ranks (Gloo) too, fp32: through the exact allocator,
    // as DDP's CPU jobs are planned.
    if (fsdp && !cuda && !(want.precision == Precision::kFp32 && !want.offload &&
                           want.sharding != Sharding::kHybrid))
      throw std::invalid_argument("--strategies " + s + ": on a CPU FSDP's zero2 and zero3 are simulated in fp32 "
                                  "only (mixed precision, offload and HSDP through the CUDA caching allocator's "
                                  "model): plan it with a CUDA --device and a trace recorded with --target cuda");
    if (fsdp && want.precision != Precision::kFp32) {
      const bool bf16 = want.precision == Precision::kBf16;
      const std::string name = bf16 ? "bf16" : "fp16";
      if (bf16 && !r.profile.supports(DType::kBF16))
        throw std::invalid_argument("--strategies " + s + ": " + r.profile.name + " has no bf16 (FSDP's "
                                    "MixedPrecision(param_dtype=torch.bfloat16) needs it)");
      if (!(bf16 ? has_mixed : has_mixed16))
        throw std::invalid_argument("--strategies " + s + ": FSDP's MixedPrecision(param_dtype=torch." +
                                    (bf16 ? "bfloat16" : "float16") + ") needs the model's traces in " + name +
                                    ": record the trace file with trace_recorder.py --target cuda --param-dtype " +
                                    name);
      // 1.13's FSDP runs a world of one as NO_SHARD, cast as a whole
      // (planner/pytorch_fsdp.cc); FSDP2's world of one computes in fp32.
      if (fsdp2 && (want.sharding == Sharding::kHybrid ? r.gpus_per_node : r.gpus_per_node * r.nodes) == 1)
        throw std::invalid_argument("--strategies " + s + ": FSDP2's MixedPrecisionPolicy sharded over one GPU is "
                                    "not simulated in this version (its world of one copies each shard in fp32)");
    }
    if (fsdp && want.wrap == "block" &&
        std::none_of(file->modules.begin(), file->modules.end(), [](const ModuleNode& m) { return m.is_block; }))
      throw std::invalid_argument("--strategies " + s + ": wrap=block is transformer_auto_wrap_policy over the "
                                  "model's block class, and the trace file marks no module as a block (the "
                                  "recorder marks instances of the model's block_class attribute)");
    if (fsdp) candidates.push_back(want);
  }
  for (const std::string& p : r.candidates.precisions)
    if (p != "fp32" && p != amp_name && p != "all")
      throw std::invalid_argument("--precision " + p + ": --stack pytorch simulates fp32 and, on this device, " +
                                  amp_name + " (autocast" + (cuda ? " with GradScaler" : "") + ") only in this "
                                  "version");
  auto precision_wanted = [&](const Candidate& c) {
    if (r.candidates.precisions.empty()) return true;
    for (const std::string& p : r.candidates.precisions)
      if (p == "all" || p == spec::precision_name(c.precision)) return true;
    return false;
  };
  for (const char* id : {"ddp/fp32/wrap=none", "zero1/fp32/wrap=none", "ddp+ckpt/fp32/wrap=none",
                         "zero1+ckpt/fp32/wrap=none", "ddp/AMP/wrap=none", "zero1/AMP/wrap=none"}) {
    std::string full = id;
    if (const size_t at = full.find("AMP"); at != std::string::npos) full.replace(at, 3, amp_name);
    const Candidate c = parse_candidate(full);
    if ((c.recompute && !has_ckpt) || (c.precision == amp && !has_amp) || !precision_wanted(c)) continue;
    bool wanted = r.candidates.strategies.empty();
    for (const std::string& s : r.candidates.strategies)
      wanted = wanted || s == spec::sharding_name(c.sharding) || s == c.to_id();
    if (wanted) candidates.insert(candidates.end() - std::count_if(candidates.begin(), candidates.end(), is_fsdp), c);
  }
  if (r.optimizer != Optimizer::kAdamW || file->optimizer_steps.size() != 2)
    throw std::invalid_argument("--stack pytorch: needs --optimizer adamw and a trace file with the optimizer's "
                                "steps (record it again with pytorch/trace_recorder.py)");
  const bool has_foreach = file->optimizer_foreach_steps.size() == 2;
  if (r.adamw_foreach.value_or(false) && !has_foreach)
    throw std::invalid_argument("--adamw-step foreach: the trace file has no AdamW(foreach=True) steps (recorded "
                                "since 2026-12-03: record it again with pytorch/trace_recorder.py)");
  if (r.grad_accum != 1 && r.ddp_bucket_view)
    throw std::invalid_argument("--grad-accum with --ddp-bucket-view: not simulated in this version (a no_sync "
                                "micro-batch makes .grad tensors of its own that the synced one replaces by bucket "
                                "views)");
  if (r.ddp_static_graph && r.grad_accum != 1)
    throw std::invalid_argument("--ddp-static-graph with --grad-accum: PyTorch 1.13 cannot run it (its reducer "
                                "asserts expect_autograd_hooks_ in the first no_sync backward: reducer.cpp, seen "
                                "here)");
  if (r.ddp_static_graph)
    for (const Candidate& c : candidates)
      if (is_fsdp(c))
        throw std::invalid_argument("--ddp-static-graph with PyTorch FSDP (" + c.to_id() + "): a DDP option");
  if (r.grad_accum != 1)
    for (const Candidate& c : candidates)
      if (is_fsdp(c))
        throw std::invalid_argument("--grad-accum with PyTorch FSDP (" + c.to_id() + "): not simulated in this "
                                    "version (DDP and zero1 only)");
  if (r.single_gpu_unwrapped) {
    if (r.gpus_per_node * r.nodes != 1)
      throw std::invalid_argument("--single-gpu-unwrapped: a one-process job's option (--gpus 1, --nodes 1)");
    if (r.ddp_bucket_view || r.ddp_static_graph)
      throw std::invalid_argument("--single-gpu-unwrapped with --ddp-bucket-view or --ddp-static-graph: DDP's "
                                  "options, and the model is not in DDP");
  }
  // Every input checked: a bad one stays one line.
  if (!amp_not_affine.empty())
    spdlog::warn("--stack pytorch: no {} candidates: the autocast traces are not batch-affine ({})", amp_name,
                 amp_not_affine);
  const int world = r.gpus_per_node * r.nodes;
  PytorchDdpInputs in;
  in.param_bytes = file->param_count() * dtype_bytes(DType::kF32);
  // AdamW(foreach=True): its multi-tensor step over every parameter, as traced.
  in.optimizer_first = &file->optimizer_steps[0];
  in.optimizer_later = &file->optimizer_steps[1];
  in.param_numels = file->param_numels();
  in.buffers = file->buffers();
  if (!file->optimizer_zero_grad.events.empty()) in.zero_grad = &file->optimizer_zero_grad;
  in.optimizer_param_steps = &file->optimizer_param_steps;
  // The same with AdamW(foreach=True): zero1's partition and FSDP's shards
  // compose their multi-tensor steps from the traced ones
  // (planner/adamw_steps.h); split once, here.
  PytorchDdpInputs in_foreach = in;
  std::optional<MultiTensorAdamwStep> foreach_first, foreach_later;
  if (has_foreach) {
    const std::vector<ModelTrace>& adamw = file->optimizer_foreach_steps;
    in_foreach.optimizer_first = &adamw[0];
    in_foreach.optimizer_later = &adamw[1];
    std::vector<int64_t> param_bytes;
    for (int64_t numel : in.param_numels) param_bytes.push_back(numel * dtype_bytes(DType::kF32));
    foreach_first.emplace(adamw[0], param_bytes);
    foreach_later.emplace(adamw[1], param_bytes);
    in_foreach.foreach_first = &*foreach_first;
    in_foreach.foreach_later = &*foreach_later;
  }
  // Each candidate's AdamW step: --adamw-step's, else its PyTorch's default.
  bool foreach_unrecorded = false;
  auto foreach_for = [&](const Candidate& c) {
    if (r.adamw_foreach) return *r.adamw_foreach;
    const bool wanted = adamw_foreach_default(r.torch, cuda, is_fsdp(c) && r.fsdp_version == 1);
    foreach_unrecorded = foreach_unrecorded || (wanted && !has_foreach);
    return wanted && has_foreach;
  };
  // The traces a candidate replays (at1 / affine's first index).
  auto kind_of = [&](const Candidate& c) {
    return is_fsdp(c) && c.precision == Precision::kBf16   ? kMixed
           : is_fsdp(c) && c.precision == Precision::kFp16 ? kMixed16
           : c.precision == amp                           ? 2
           : c.recompute                                  ? 1
                                                          : 0;
  };
  // FSDP's allocator: the exact one on CPU ranks, the caching allocator's
  // model on CUDA.
  auto device_allocator = [&]() -> std::unique_ptr<AllocatorModel> {
    if (!cuda) return std::make_unique<ExactAllocator>(budget);
    return std::make_unique<CudaCachingAllocatorModel>(budget);
  };
  // Every rank's result at `batch` (one when the ranks are alike).
  auto simulate = [&](const Candidate& c, int64_t batch) {
    const int k = kind_of(c);
    const ModelTrace none = batch == 1 ? *at1[k][0] : affine[k][0]->at(batch);
    const ModelTrace with = batch == 1 ? *at1[k][1] : affine[k][1]->at(batch);
    PytorchDdpInputs at = foreach_for(c) ? in_foreach : in;
    at.no_grads = &none;
    at.with_grads = &with;
    PytorchDdpOptions o;
    o.gradient_as_bucket_view = r.ddp_bucket_view;
    o.bucket_cap_bytes = r.schedule.ddp_bucket_cap_bytes;
    o.zero_grad_set_to_none = r.zero_grad_set_to_none;
    o.budget_bytes = budget;
    o.cuda_caching = cuda && r.profile.allocator == AllocatorKind::kCudaCaching;
    if (cuda) o.overhead_bytes = r.profile.cublas_workspace_allocations;
    // Step 2 is the steady state; with static_graph step 3 (step 2 starts
    // with the first iteration's _DDPSink clones held as the outputs).
    o.steps = std::min(r.steps, r.ddp_static_graph ? 3 : 2);
    o.zero_redundancy = c.sharding == Sharding::kZero1;
    o.grad_scaler = c.precision == Precision::kFp16;  // AMP's fp16 recipe: autocast + GradScaler
    o.grad_accum = r.grad_accum;
    o.static_graph = r.ddp_static_graph;
    o.world_size = world;
    o.wrapped = !(r.single_gpu_unwrapped && c.sharding == Sharding::kDdp);
    std::vector<StepSimResult> ranks;
    if (is_fsdp(c) && r.fsdp_version == 2) {
      // Rank 0, whose shards are the padded size: no rank holds more.
      PytorchFsdp2Options f;
      f.reshard_after_forward = c.sharding == Sharding::kZero3;
      // fully_shard(model, reshard_after_forward=True) on the root too, as
      // the blocks are called (torch 2.11 reshards the root then).
      f.reshard_root_after_forward = f.reshard_after_forward;
      f.offload_params = c.offload;
      f.wrap_blocks = c.wrap == "block";
      f.mixed_precision = compute_dtype(c.precision);
      f.grad_scaler = c.precision == Precision::kFp16;  // ShardedGradScaler
      f.reduce_dtype = parse_fsdp_reduce_dtype(r.fsdp_reduce_dtype);
      f.hsdp = c.sharding == Sharding::kHybrid;  // sharded within a node, replicated across nodes
      f.world_size = f.hsdp ? r.gpus_per_node : world;
      f.steps = o.steps;
      f.overhead_bytes = o.overhead_bytes;
      f.zero_grad_set_to_none = o.zero_grad_set_to_none;
      if (r.schedule.prefetch >= 2) {  // --prefetch N: explicit, N - 1 blocks ahead, N back
        f.forward_prefetch = r.schedule.prefetch - 1;
        f.backward_prefetch = r.schedule.prefetch;
      }
      f.cpu = !cuda;
      ranks.push_back(simulate_pytorch_fsdp2(at, file->modules, f, *device_allocator()));
      return ranks;
    }
    if (is_fsdp(c)) {
      // Every rank alike (the padded shards are one size).
      PytorchFsdpOptions f;
      f.reshard_after_forward = c.sharding == Sharding::kZero3;
      f.offload_params = c.offload;
      f.wrap = WrapPolicy::parse(c.wrap);
      f.world_size = world;
      f.steps = o.steps;
      f.budget_bytes = budget;
      f.overhead_bytes = o.overhead_bytes;
      f.zero_grad_set_to_none = o.zero_grad_set_to_none;
      f.backward_prefetch = r.fsdp_backward_prefetch;
      f.forward_prefetch = r.schedule.prefetch >= 2;  // --prefetch 2: FSDP(forward_prefetch=True)
      f.mixed_precision = compute_dtype(c.precision);
      f.grad_scaler = c.precision == Precision::kFp16;  // ShardedGradScaler
      f.reduce_dtype = parse_fsdp_reduce_dtype(r.fsdp_reduce_dtype);
      f.keep_low_precision_grads = r.fsdp_keep_low_precision_grads;
      f.cpu = !cuda;
      ranks.push_back(simulate_pytorch_fsdp(at, file->modules, f, *device_allocator()));
      return ranks;
    }
    for (int rank = 0; rank < (o.zero_redundancy ? world : 1); ++rank) {
      o.rank = rank;
      ranks.push_back(simulate_pytorch_ddp(at, o));
    }
    return ranks;
  };
  auto fits = [](const std::vector<StepSimResult>& ranks) {
    return std::none_of(ranks.begin(), ranks.end(), [](const StepSimResult& x) { return x.oom; });
  };
  auto worst = [](const std::vector<StepSimResult>& ranks) -> const StepSimResult& {
    for (const auto& x : ranks)
      if (x.oom) return x;
    return *std::max_element(ranks.begin(), ranks.end(), [](const StepSimResult& a, const StepSimResult& b) {
      return a.peak_allocated_bytes < b.peak_allocated_bytes;
    });
  };

  Plan plan;
  plan.stack = "pytorch";
  plan.ddp_bucket_view = r.ddp_bucket_view;
  plan.ddp_static_graph = r.ddp_static_graph;
  plan.single_gpu_unwrapped = r.single_gpu_unwrapped;
  plan.pytorch_job = Plan::PytorchJob{r.torch, r.zero_grad_set_to_none ? "none" : "zero",
                                      r.ckpt_reentrant ? "reentrant" : "non-reentrant", r.schedule.ddp_bucket_cap_bytes,
                                      r.fsdp_backward_prefetch == FsdpBackwardPrefetch::kBackwardPost ? "post"
                                      : r.fsdp_backward_prefetch == FsdpBackwardPrefetch::kNone       ? "none"
                                                                                                       : "pre",
                                      r.steps, r.fsdp_version, r.fsdp_reduce_dtype,
                                      r.adamw_foreach.value_or(false), r.fsdp_keep_low_precision_grads};
  plan.model = {file->model_name, file->param_count(), r.seq_len, "traced", "traced", file->block_class()};
  plan.hardware.profile = r.profile.name;
  plan.hardware.device_mem_bytes = device_mem;
  if (device_mem > 0 && budget < device_mem) plan.hardware.allocator_budget_bytes = budget;
  plan.hardware.gpus_per_node = r.gpus_per_node;
  plan.hardware.nodes = r.nodes;
  plan.optimizer = "adamw";
  plan.grad_accum = r.grad_accum;
  plan.objective = r.objective;
  for (const Candidate& c : candidates) {
    PlanCandidate pc;
    pc.candidate = c;
    pc.units = is_fsdp(c) ? static_cast<int>(fsdp_units(file->modules, c, r.fsdp_version).units.size()) : 1;
    pc.adamw_foreach = foreach_for(c);
    pc.max_batch_per_gpu = search_max_batch([&](int64_t b) { return fits(simulate(c, b)); }, r.max_batch);
    const auto at_fit = simulate(c, std::max<int64_t>(pc.max_batch_per_gpu, 1));
    const StepSimResult& fit = worst(at_fit);
    pc.predicted.peak_allocated_bytes = fit.peak_allocated_bytes;
    pc.predicted.peak_reserved_bytes = fit.peak_reserved_bytes;
    pc.predicted.breakdown = to_breakdown(fit.peak_breakdown_bytes);
    if (at_fit.size() > 1)
      for (const auto& x : at_fit) pc.predicted.rank_peak_allocated_bytes.push_back(x.peak_allocated_bytes);
    if (pc.max_batch_per_gpu > 0)
      for (const auto& x : at_fit) {
        pc.predicted.rank_timelines.emplace_back();
        for (const auto& t : x.timeline)
          pc.predicted.rank_timelines.back().push_back({t.label, t.allocated_bytes, t.peak_allocated_bytes});
      }
    if (pc.max_batch_per_gpu >= r.max_batch) {
      pc.limit = "no memory limit (search capped at batch " + std::to_string(r.max_batch) + ")";
    } else {
      const auto next = pc.max_batch_per_gpu > 0 ? simulate(c, pc.max_batch_per_gpu + 1) : at_fit;
      set_limit(pc, worst(next), pc.max_batch_per_gpu + 1);
    }
    if (pc.max_batch_per_gpu > 0) {
      set_step_time(pc, pytorch_step_time(c, r, *file, world, *affine[kind_of(c)][0], pc.max_batch_per_gpu));
    }
    plan.candidates.push_back(pc);
  }
  if (foreach_unrecorded)
    spdlog::warn("--trace: no AdamW(foreach=True) steps in the file (recorded since 2026-12-03), the step PyTorch {} "
                 "takes on CUDA when the script passes no foreach: planned with the for-loop step; record the trace "
                 "again for it", r.torch);
  if (auto best = choose(plan.candidates, r.objective)) plan.chosen = plan.candidates[*best].id();
  return plan;
}


}  // namespace shardfit::planner
