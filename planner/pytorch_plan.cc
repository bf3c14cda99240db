#include <algorithm>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
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
#include "planner/pytorch_step_time.h"
#include "planner/time_model.h"
#include "planner/trace.h"
#include "spec/recompute.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {
namespace {

// The traces a candidate replays, by kind, and grads at start: batch 1
// exactly, 2 and 3 extended affinely.
enum TraceKind : int { kFp32 = 0, kCkpt = 1, kAmp = 2, kMixed = 3, kMixed16 = 4, kMixedCkpt = 5, kTraceKinds = 6 };


// What the trace file holds for the candidates, read once.
struct PytorchTraces {
  // The blocks, under torch.utils.checkpoint for +ckpt (what a plan
  // recomputes when nothing but the root is a unit: spec/recompute.h).
  std::vector<int> blocks;
  // fp32 traces: absent where the recorder could not imitate the target's
  // fp32 kernels (trace_recorder.py: transformers' sdpa on CUDA); the
  // file's other traces still plan their candidates.
  bool has_fp32 = false;
  bool has_ckpt = false;
  // Traces whose forward ran under torch.autocast (trace_recorder.py: bf16
  // for a CPU target, fp16 with GradScaler for a CUDA one): the bf16 / fp16
  // candidates, PyTorch's mixed precision (fp32 parameters, gradients and
  // AdamW).
  DType amp_dtype = DType::kF32;
  Precision amp = Precision::kFp32;
  std::string amp_name;
  bool has_amp = false;
  // Traces of the model cast to bf16 or fp16, not under autocast
  // (trace_recorder.py --param-dtype; fp16 for CUDA targets only): what
  // FSDP's MixedPrecision(param_dtype=...) computes.
  bool has_mixed = false, has_mixed16 = false;
  // The bf16 cast model with the blocks checkpointed (a CUDA target's
  // recording): FSDP2's MixedPrecisionPolicy with activation checkpointing.
  bool has_mixed_ckpt = false;
  // By kind ([kFp32], [kCkpt] with the blocks checkpointed, [kAmp] the
  // forward under autocast, [kMixed] the model in bf16, [kMixed16] in fp16,
  // [kMixedCkpt] in bf16 with the blocks checkpointed)
  // and grads at start.
  const ModelTrace* at1[kTraceKinds][2] = {};
  std::unique_ptr<AffineTrace> affine[kTraceKinds][2];
  // Autocast traces whose sizes are not affine in the batch (a CPU bf16
  // matmul's oneDNN scratchpad follows the shapes' blocking, not the batch):
  // no autocast candidates, said once; fp32 plans as before. The same for a
  // CPU trace of the model cast to bf16: no bf16 FSDP candidates.
  std::string amp_not_affine, mixed_not_affine;
};

void load_traces(const PlanRequest& r, const TraceFile& file, bool cuda, PytorchTraces& t) {
  t.blocks = spec::recompute_modules(file.modules, wrap_modules(file.modules, WrapPolicy::parse("none")));
  t.has_fp32 = file.find(DType::kF32, {}, 1, false, false) != nullptr;
  t.has_ckpt = !t.blocks.empty() && file.find(DType::kF32, t.blocks, 1, false, r.ckpt_reentrant);
  t.amp_dtype = cuda ? DType::kF16 : DType::kBF16;
  t.amp = cuda ? Precision::kFp16 : Precision::kBf16;
  t.amp_name = spec::precision_name(t.amp);
  t.has_amp = file.find(t.amp_dtype, {}, 1, false, false, /*autocast=*/true) != nullptr;
  auto cast_traces = [&](DType d) { return file.find(d, {}, 1, false, false, /*autocast=*/false) != nullptr; };
  t.has_mixed = cast_traces(DType::kBF16);
  t.has_mixed16 = cast_traces(DType::kF16);
  t.has_mixed_ckpt = !t.blocks.empty() && file.find(DType::kBF16, t.blocks, 1, false, r.ckpt_reentrant) != nullptr;
  for (int k = 0; k < kTraceKinds; ++k) {
    if ((k == kFp32 && !t.has_fp32) || (k == kCkpt && !t.has_ckpt) || (k == kAmp && !t.has_amp) ||
        (k == kMixed && !t.has_mixed) || (k == kMixed16 && !t.has_mixed16) ||
        (k == kMixedCkpt && !t.has_mixed_ckpt))
      continue;
    const DType dtype = k == kAmp                        ? t.amp_dtype
                        : k == kMixed || k == kMixedCkpt ? DType::kBF16
                        : k == kMixed16                  ? DType::kF16
                                                         : DType::kF32;
    const bool ckpt = k == kCkpt || k == kMixedCkpt;
    const std::vector<int> rec = ckpt ? t.blocks : std::vector<int>{};
    for (int g = 0; g < 2; ++g) {
      const ModelTrace* at[4] = {};
      for (int b = 1; b <= 3; ++b) at[b] = file.find(dtype, rec, b, g == 1, r.ckpt_reentrant && ckpt, k == kAmp);
      if (!at[1] || !at[2] || !at[3])
        throw std::invalid_argument(std::string("--stack pytorch: the trace file has no ") +
                                    (k == kAmp                       ? "autocast(" + t.amp_name + ")"
                                     : k == kMixed || k == kMixedCkpt ? std::string("bf16 (the model cast)")
                                     : k == kMixed16                 ? std::string("fp16 (the model cast)")
                                                                     : std::string("fp32")) +
                                    " trace" + (ckpt ? " with the blocks checkpointed" : "") + " with grads " +
                                    (g == 1 ? "accumulate" : "none") + " at batches 1, 2 and 3");
      t.at1[k][g] = at[1];
      try {
        t.affine[k][g] = std::make_unique<AffineTrace>(*at[2], *at[3]);
      } catch (const std::logic_error& e) {
        // fp32's traces must be affine, and a CUDA target's cast ones.
        if (k != kAmp && !(k == kMixed && !cuda)) throw;
        (k == kAmp ? t.amp_not_affine : t.mixed_not_affine) = e.what();
      }
    }
  }
  if (!t.amp_not_affine.empty()) t.has_amp = false;  // said once the candidates are known (build_pytorch_plan)
  if (!t.mixed_not_affine.empty()) t.has_mixed = false;  // said by check_fsdp_mixed, for a candidate that needs them
  if (r.ckpt_reentrant && !t.blocks.empty() && !t.has_ckpt)
    throw std::invalid_argument("--checkpoint reentrant: the trace file has no traces with use_reentrant=True (record "
                                "it again with pytorch/trace_recorder.py)");
}

// An FSDP candidate `want` (--strategies `s`) in bf16 or fp16: the device,
// the trace file's cast traces and the world it needs.
void check_fsdp_mixed(const PlanRequest& r, const PytorchTraces& t, const std::string& s, const Candidate& want) {
  const bool bf16 = want.precision == Precision::kBf16;
  const std::string name = bf16 ? "bf16" : "fp16";
  if (bf16 && !r.profile.supports(DType::kBF16))
    throw std::invalid_argument("--strategies " + s + ": " + r.profile.name + " has no bf16 (FSDP's "
                                "MixedPrecision(param_dtype=torch.bfloat16) needs it)");
  if (bf16 && !t.mixed_not_affine.empty())
    throw std::invalid_argument("--strategies " + s + ": the trace file's bf16 traces of the cast model are not "
                                "batch-affine, so it cannot be planned in this version (" + t.mixed_not_affine + ")");
  if (!(bf16 ? t.has_mixed : t.has_mixed16))
    throw std::invalid_argument("--strategies " + s + ": FSDP's MixedPrecision(param_dtype=torch." +
                                (bf16 ? "bfloat16" : "float16") + ") needs the model's traces in " + name +
                                ": record the trace file with trace_recorder.py " +
                                (r.profile.kind == DeviceKind::kCuda ? "--target cuda " : "") + "--param-dtype " +
                                name);
  // 1.13's FSDP runs a world of one as NO_SHARD, cast as a whole
  // (planner/pytorch_fsdp.cc); FSDP2's world of one computes in fp32.
  if (r.fsdp_version == 2 && (want.sharding == Sharding::kHybrid ? r.gpus_per_node : r.gpus_per_node * r.nodes) == 1)
    throw std::invalid_argument("--strategies " + s + ": FSDP2's MixedPrecisionPolicy sharded over one GPU is "
                                "not simulated in this version (its world of one copies each shard in fp32)");
}


// The FSDP candidates --strategies names by full id (ddp and zero1 come
// from pytorch_ddp_candidates); anything --stack pytorch does not simulate
// is refused, one line.
std::vector<Candidate> requested_fsdp(const PlanRequest& r, const TraceFile& file, const PytorchTraces& t, bool cuda) {
  std::vector<Candidate> candidates;
  const Precision amp = t.amp;
  for (const std::string& s : r.candidates.strategies) {
    if (s == "ddp" || s == "zero1") continue;
    const Candidate want = s.find('/') == std::string::npos ? Candidate{} : parse_candidate(s);
    const bool ddp_like = (want.sharding == Sharding::kDdp || want.sharding == Sharding::kZero1) && !want.offload &&
                          want.wrap == "none" &&
                          (want.precision == Precision::kFp32 || (want.precision == amp && !want.recompute));
    const bool fsdp2 = r.fsdp_version == 2;
    // FSDP2 with activation checkpointing: in bf16, from the cast model's
    // checkpointed traces (a CUDA recording's).
    const bool fsdp = is_fsdp(want) && (fsdp2 ? !fsdp_no_shard(want) : want.sharding != Sharding::kHybrid) &&
                      (!want.recompute || (fsdp2 && want.precision == Precision::kBf16)) &&
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
                                  "(transformer_auto_wrap_policy), FSDP1's NO_SHARD as ddp/.../wrap=size:N or block, with "
                                  "--fsdp-version 2 also hybrid (HSDP) and "
                                  "wrap=block (fully_shard on each block, then the root) or wrap=none (the root "
                                  "only), and +ckpt in bf16, only in this version");
    if (fsdp && want.recompute && !t.has_mixed_ckpt)
      throw std::invalid_argument("--strategies " + s + ": FSDP2 in bf16 with activation checkpointing needs the "
                                  "cast model's traces with the blocks checkpointed: record the trace file with "
                                  "trace_recorder.py --target cuda --param-dtype bf16");
    if ((ddp_like || fsdp) && want.precision == Precision::kFp32 && !t.has_fp32)
      throw std::invalid_argument("--strategies " + s + ": the trace file has no fp32 traces (the recorder makes "
                                  "none where the target's fp32 kernels are not imitated: transformers' sdpa on "
                                  "CUDA); its bf16 and fp16 candidates plan");
    if (!fsdp && want.precision == amp && !t.has_amp)
      throw std::invalid_argument(
          "--strategies " + s +
          (t.amp_not_affine.empty()
               ? ": the trace file has no traces under torch.autocast(" + t.amp_name +
                     ") (trace_recorder.py records them: bf16 for --target cpu, fp16 for --target cuda)"
               : ": its autocast traces are not batch-affine, so it cannot be planned in this version (" +
                     t.amp_not_affine + ")"));
    // FSDP runs on CPU ranks (Gloo) too: fp32 through the exact allocator,
    // as DDP's CPU jobs are planned; FSDP2 with CPUOffloadPolicy
    // (fsdp2_options: the host is the device), as HSDP, and by block under
    // MixedPrecisionPolicy(param_dtype=torch.bfloat16) from the CPU trace of
    // the model cast to bf16 (which casts each block's inputs, as
    // fully_shard on the blocks does: trace_recorder.py); FSDP1 under
    // MixedPrecision(param_dtype=torch.bfloat16) from the same traces where
    // those casts converted nothing (its root casts the inputs, ids here).
    const bool on_cpu = want.precision == Precision::kFp32
                            ? !want.offload || fsdp2
                            : want.precision == Precision::kBf16 && (fsdp2 ? want.wrap == "block" : !want.offload);
    if (fsdp && !cuda && !on_cpu)
      throw std::invalid_argument("--strategies " + s + ": on a CPU FSDP is simulated in fp32, and FSDP2 also with "
                                  "offload or in bf16 by block (MixedPrecisionPolicy, offload or not), FSDP1 in "
                                  "bf16 without offload; the rest through the CUDA caching allocator's model: plan "
                                  "it with a CUDA --device and a trace recorded with --target cuda");
    if (fsdp && !cuda && !fsdp2 && want.precision == Precision::kBf16 && file.block_input_casts != 0)
      throw std::invalid_argument(
          "--strategies " + s + ": FSDP1's MixedPrecision casts only the root's inputs, and " +
          (file.block_input_casts < 0
               ? "the trace file does not say whether its bf16 traces cast any block's inputs (record it again with "
                 "this version's trace_recorder.py --param-dtype bf16)"
               : "the trace file's bf16 traces cast " + std::to_string(file.block_input_casts) +
                     " floating block inputs, as FSDP2's fully_shard does: plan it with --fsdp-version 2"));
    if (fsdp && want.precision != Precision::kFp32) check_fsdp_mixed(r, t, s, want);
    if (fsdp && want.wrap == "block" &&
        std::none_of(file.modules.begin(), file.modules.end(), [](const ModuleNode& m) { return m.is_block; }))
      throw std::invalid_argument("--strategies " + s + ": wrap=block is transformer_auto_wrap_policy over the "
                                  "model's block class, and the trace file marks no module as a block (the "
                                  "recorder marks instances of the model's block_class attribute)");
    if (fsdp) candidates.push_back(want);
  }
  return candidates;
}


// The ddp and zero1 candidates --strategies (a sharding or a full id) and
// --precision ask for, before the FSDP ones in `candidates`.
void add_ddp_candidates(const PlanRequest& r, const PytorchTraces& t, bool cuda, std::vector<Candidate>& candidates) {
  for (const std::string& p : r.candidates.precisions)
    if (p != "fp32" && p != t.amp_name && p != "all")
      throw std::invalid_argument("--precision " + p + ": --stack pytorch simulates fp32 and, on this device, " +
                                  t.amp_name + " (autocast" + (cuda ? " with GradScaler" : "") + ") only in this "
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
    if (const size_t at = full.find("AMP"); at != std::string::npos) full.replace(at, 3, t.amp_name);
    const Candidate c = parse_candidate(full);
    if ((c.precision == Precision::kFp32 && !t.has_fp32) || (c.recompute && !t.has_ckpt) ||
        (c.precision == t.amp && !t.has_amp) || !precision_wanted(c))
      continue;
    bool wanted = r.candidates.strategies.empty();
    for (const std::string& s : r.candidates.strategies)
      wanted = wanted || s == spec::sharding_name(c.sharding) || s == c.to_id();
    if (wanted) candidates.insert(candidates.end() - std::count_if(candidates.begin(), candidates.end(), is_fsdp), c);
  }
}

// The job's options against the candidates: what PyTorch cannot run, or
// this version does not simulate, refused in one line.
void check_job(const PlanRequest& r, const TraceFile& file, const std::vector<Candidate>& candidates) {
  if (r.optimizer != Optimizer::kAdamW || file.optimizer_steps.size() != 2)
    throw std::invalid_argument("--stack pytorch: needs --optimizer adamw and a trace file with the optimizer's "
                                "steps (record it again with pytorch/trace_recorder.py)");
  if (r.adamw_step == AdamwStep::kForeach && file.optimizer_foreach_steps.size() != 2)
    throw std::invalid_argument("--adamw-step foreach: the trace file has no AdamW(foreach=True) steps (recorded "
                                "since 2026-12-03: record it again with pytorch/trace_recorder.py)");
  if (r.adamw_step == AdamwStep::kFused && file.optimizer_fused_steps.size() != 2)
    throw std::invalid_argument("--adamw-step fused: the trace file has no AdamW(fused=True) steps (recorded under "
                                "PyTorch 2.x since 2026-12-05: record it again with pytorch/trace_recorder.py)");
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
}

// Each candidate's simulation at a batch: the trace file's inputs, read
// once, and the options each simulation takes from the request.
class PytorchJobSim {
 public:
  PytorchJobSim(const PlanRequest& r, const TraceFile& file, const PytorchTraces& t, int64_t budget);
  PytorchJobSim(const PytorchJobSim&) = delete;  // in_foreach_ and in_fused_ point into it
  PytorchJobSim& operator=(const PytorchJobSim&) = delete;
  // Every rank's result at `batch` (one when the ranks are alike).
  std::vector<StepSimResult> simulate(const Candidate& c, int64_t batch);
  // The same at batch 1 with no memory limit: what batch 1 needs.
  std::vector<StepSimResult> simulate_unlimited_batch1(const Candidate& c) {
    struct Restore {
      int64_t& budget;
      const int64_t capped;
      ~Restore() { budget = capped; }
    } restore{budget_, std::exchange(budget_, kUnlimitedBytes)};
    return simulate(c, 1);
  }
  // Each candidate's AdamW step: --adamw-step's, else its PyTorch's default.
  AdamwStep step_for(const Candidate& c);
  // The traces a candidate replays (PytorchTraces::at1 / affine's first index).
  int kind_of(const Candidate& c) const {
    return is_fsdp(c) && c.precision == Precision::kBf16 && c.recompute ? kMixedCkpt
           : is_fsdp(c) && c.precision == Precision::kBf16   ? kMixed
           : is_fsdp(c) && c.precision == Precision::kFp16 ? kMixed16
           : c.precision == t_.amp                         ? kAmp
           : c.recompute                                   ? kCkpt
                                                           : kFp32;
  }
  bool foreach_unrecorded() const { return foreach_unrecorded_; }

 private:
  PytorchDdpOptions ddp_options(const Candidate& c) const;
  PytorchFsdpOptions fsdp1_options(const Candidate& c, const PytorchDdpOptions& o) const;
  PytorchFsdp2Options fsdp2_options(const Candidate& c, const PytorchDdpOptions& o) const;
  // FSDP's allocator: the exact one on CPU ranks, the caching allocator's
  // model on CUDA.
  std::unique_ptr<AllocatorModel> device_allocator() const {
    if (!cuda_) return std::make_unique<ExactAllocator>(budget_);
    return std::make_unique<CudaCachingAllocatorModel>(budget_);
  }

  const PlanRequest& r_;
  const TraceFile& file_;
  const PytorchTraces& t_;
  int64_t budget_;  // the allocator's limit (kUnlimitedBytes: none)
  const bool cuda_;
  const int world_;
  const bool has_foreach_;
  PytorchDdpInputs in_, in_foreach_, in_fused_;
  std::optional<MultiTensorAdamwStep> foreach_first_, foreach_later_, fused_first_, fused_later_;
  bool foreach_unrecorded_ = false;
};

PytorchJobSim::PytorchJobSim(const PlanRequest& r, const TraceFile& file, const PytorchTraces& t, int64_t budget)
    : r_(r),
      file_(file),
      t_(t),
      budget_(budget),
      cuda_(r.profile.kind == DeviceKind::kCuda),
      world_(r.gpus_per_node * r.nodes),
      has_foreach_(file.optimizer_foreach_steps.size() == 2) {
  in_.param_bytes = file.param_count() * dtype_bytes(DType::kF32);
  // The for-loop AdamW (foreach=False): its steps over every parameter, as traced.
  in_.optimizer_first = &file.optimizer_steps[0];
  in_.optimizer_later = &file.optimizer_steps[1];
  in_.param_numels = file.param_numels();
  in_.buffers = file.buffers();
  if (!file.optimizer_zero_grad.events.empty()) in_.zero_grad = &file.optimizer_zero_grad;
  in_.optimizer_param_steps = &file.optimizer_param_steps;
  // The same with AdamW(foreach=True) and AdamW(fused=True): DDP replays
  // their steps as traced; zero1's partition and FSDP's shards compose
  // theirs from them (planner/adamw_steps.h), split once, here.
  std::vector<int64_t> param_bytes;
  for (int64_t numel : in_.param_numels) param_bytes.push_back(numel * dtype_bytes(DType::kF32));
  auto over_the_list = [&](const std::vector<ModelTrace>& steps, AdamwStep which, PytorchDdpInputs* in,
                           std::optional<MultiTensorAdamwStep>* first, std::optional<MultiTensorAdamwStep>* later) {
    *in = in_;
    if (steps.size() != 2) return;
    in->optimizer_first = &steps[0];
    in->optimizer_later = &steps[1];
    first->emplace(steps[0], param_bytes, which);
    later->emplace(steps[1], param_bytes, which);
    in->list_step_first = &**first;
    in->list_step_later = &**later;
  };
  over_the_list(file.optimizer_foreach_steps, AdamwStep::kForeach, &in_foreach_, &foreach_first_, &foreach_later_);
  over_the_list(file.optimizer_fused_steps, AdamwStep::kFused, &in_fused_, &fused_first_, &fused_later_);
}

AdamwStep PytorchJobSim::step_for(const Candidate& c) {
  if (r_.adamw_step) return *r_.adamw_step;
  const bool wanted =
      adamw_foreach_default(r_.torch, cuda_, is_fsdp(c) && r_.fsdp_version == 1 && !r_.fsdp_use_orig_params);
  foreach_unrecorded_ = foreach_unrecorded_ || (wanted && !has_foreach_);
  return wanted && has_foreach_ ? AdamwStep::kForeach : AdamwStep::kForLoop;
}

PytorchDdpOptions PytorchJobSim::ddp_options(const Candidate& c) const {
  PytorchDdpOptions o;
  o.gradient_as_bucket_view = r_.ddp_bucket_view;
  o.bucket_cap_bytes = r_.schedule.ddp_bucket_cap_bytes;
  o.zero_grad_set_to_none = r_.zero_grad_set_to_none;
  o.keep_outputs = r_.loop_keeps_outputs;
  o.budget_bytes = budget_;
  o.cuda_caching = cuda_ && r_.profile.allocator == AllocatorKind::kCudaCaching;
  if (cuda_) o.overhead_bytes = r_.profile.cublas_workspace_allocations;
  // Step 2 is the steady state; with static_graph step 3 (step 2 starts
  // with the first iteration's _DDPSink clones held as the outputs).
  o.steps = static_cast<int>(std::min<int64_t>(r_.steps, r_.ddp_static_graph ? 3 : 2));
  o.zero_redundancy = c.sharding == Sharding::kZero1;
  o.grad_scaler = c.precision == Precision::kFp16;  // AMP's fp16 recipe: autocast + GradScaler
  o.grad_accum = r_.grad_accum;
  o.static_graph = r_.ddp_static_graph;
  o.world_size = world_;
  o.wrapped = !(r_.single_gpu_unwrapped && c.sharding == Sharding::kDdp);
  return o;
}

PytorchFsdp2Options PytorchJobSim::fsdp2_options(const Candidate& c, const PytorchDdpOptions& o) const {
  PytorchFsdp2Options f;
  // zero3, and hybrid (HSDP: fully_shard over the 2-D mesh, resharding
  // after forward as the exported script calls it, launch_python.cc).
  f.reshard_after_forward = c.sharding != Sharding::kZero2;
  // fully_shard(model, reshard_after_forward=True) on the root too, as
  // the blocks are called (torch 2.11 reshards the root then).
  f.reshard_root_after_forward = f.reshard_after_forward;
  // CPUOffloadPolicy moves the shards and their gradients to the host. On a
  // CPU mesh the host is the device: torch 2.11's .cpu() at init,
  // .to(device) before the all-gather and .to("cpu") after the
  // reduce-scatter each return the tensor itself (fp32: no cast, so
  // _get_param_all_gather_inputs' offload branch gathers the shards as
  // they are), so the job allocates what it does without the policy,
  // measured so at every timeline point (docs/pytorch-stack.md).
  f.offload_params = c.offload && cuda_;
  f.offload_on_host = c.offload && !cuda_;
  f.wrap_blocks = c.wrap == "block";
  f.mixed_precision = compute_dtype(c.precision);
  f.grad_scaler = c.precision == Precision::kFp16;  // ShardedGradScaler
  f.reduce_dtype = parse_fsdp_reduce_dtype(r_.fsdp_reduce_dtype);
  f.hsdp = c.sharding == Sharding::kHybrid;  // sharded within a node, replicated across nodes
  f.world_size = f.hsdp ? r_.gpus_per_node : world_;
  f.steps = o.steps;
  f.overhead_bytes = o.overhead_bytes;
  f.zero_grad_set_to_none = o.zero_grad_set_to_none;
  f.keep_outputs = o.keep_outputs;
  f.prefetch = r_.schedule.prefetch;  // N >= 2: explicit, N - 1 blocks ahead, N back
  f.cpu = !cuda_;
  return f;
}

PytorchFsdpOptions PytorchJobSim::fsdp1_options(const Candidate& c, const PytorchDdpOptions& o) const {
  PytorchFsdpOptions f;
  f.reshard_after_forward = c.sharding == Sharding::kZero3;
  f.no_shard = fsdp_no_shard(c);
  f.offload_params = c.offload;
  f.wrap = WrapPolicy::parse(c.wrap);
  f.world_size = world_;
  f.steps = o.steps;
  f.budget_bytes = budget_;
  f.overhead_bytes = o.overhead_bytes;
  f.zero_grad_set_to_none = o.zero_grad_set_to_none;
  f.keep_outputs = o.keep_outputs;
  f.backward_prefetch = r_.fsdp_backward_prefetch;
  f.forward_prefetch = r_.schedule.prefetch >= 2;  // --prefetch 2: FSDP(forward_prefetch=True)
  f.mixed_precision = compute_dtype(c.precision);
  f.grad_scaler = c.precision == Precision::kFp16;  // ShardedGradScaler
  f.reduce_dtype = parse_fsdp_reduce_dtype(r_.fsdp_reduce_dtype);
  f.keep_low_precision_grads = r_.fsdp_keep_low_precision_grads;
  f.use_orig_params = r_.fsdp_use_orig_params;
  f.cpu = !cuda_;
  return f;
}

std::vector<StepSimResult> PytorchJobSim::simulate(const Candidate& c, int64_t batch) {
  const int k = kind_of(c);
  const ModelTrace none = batch == 1 ? *t_.at1[k][0] : t_.affine[k][0]->at(batch);
  const ModelTrace with = batch == 1 ? *t_.at1[k][1] : t_.affine[k][1]->at(batch);
  const AdamwStep step = step_for(c);
  PytorchDdpInputs at = step == AdamwStep::kFused ? in_fused_ : step == AdamwStep::kForeach ? in_foreach_ : in_;
  at.no_grads = &none;
  at.with_grads = &with;
  PytorchDdpOptions o = ddp_options(c);
  std::vector<StepSimResult> ranks;
  if (is_fsdp(c) && r_.fsdp_version == 2) {
    // Rank 0, whose shards are the padded size: no rank holds more.
    ranks.push_back(simulate_pytorch_fsdp2(at, file_.modules, fsdp2_options(c, o), *device_allocator()));
  } else if (is_fsdp(c)) {
    // Every rank alike (the padded shards are one size), unless AdamW steps
    // the original parameters' parts of each rank's shard (use_orig_params).
    PytorchFsdpOptions f = fsdp1_options(c, o);
    for (f.rank = 0; f.rank < (f.use_orig_params ? world_ : 1); ++f.rank)
      ranks.push_back(simulate_pytorch_fsdp(at, file_.modules, f, *device_allocator()));
  } else {
    for (int rank = 0; rank < (o.zero_redundancy ? world_ : 1); ++rank) {
      o.rank = rank;
      ranks.push_back(simulate_pytorch_ddp(at, o));
    }
  }
  return ranks;
}

bool fits(const std::vector<StepSimResult>& ranks) {
  return std::none_of(ranks.begin(), ranks.end(), [](const StepSimResult& x) { return x.oom; });
}

// The rank that decides: the first out of memory, else the largest peak.
const StepSimResult& worst(const std::vector<StepSimResult>& ranks) {
  for (const auto& x : ranks)
    if (x.oom) return x;
  return *std::max_element(ranks.begin(), ranks.end(), [](const StepSimResult& a, const StepSimResult& b) {
    return a.peak_allocated_bytes < b.peak_allocated_bytes;
  });
}

// One candidate's batch search: the largest batch every rank fits, the
// prediction there (each rank's peak and timeline), what stops the next
// batch, and the step time.
PlanCandidate search_pytorch_candidate(const Candidate& c, const PlanRequest& r, const TraceFile& file,
                                       const PytorchTraces& t, PytorchJobSim& sim) {
  PlanCandidate pc;
  pc.candidate = c;
  pc.units = is_fsdp(c) ? static_cast<int>(fsdp_units(file.modules, c, r.fsdp_version).units.size()) : 1;
  pc.adamw_step = adamw_step_name(sim.step_for(c));
  pc.max_batch_per_gpu = search_max_batch([&](int64_t b) { return fits(sim.simulate(c, b)); }, r.max_batch);
  const auto at_fit = sim.simulate(c, std::max<int64_t>(pc.max_batch_per_gpu, 1));
  // Fitting no batch, its prediction is what batch 1 needs (no memory limit).
  set_fit(pc, pc.max_batch_per_gpu > 0 ? worst(at_fit) : worst(sim.simulate_unlimited_batch1(c)));
  if (at_fit.size() > 1)
    for (const auto& x : at_fit) pc.predicted.rank_peak_allocated_bytes.push_back(x.peak_allocated_bytes);
  if (pc.max_batch_per_gpu > 0)
    for (const auto& x : at_fit) {
      pc.predicted.rank_timelines.emplace_back();
      for (const auto& p : x.timeline)
        pc.predicted.rank_timelines.back().push_back({p.label, p.allocated_bytes, p.peak_allocated_bytes});
    }
  if (!set_search_capped(pc, r.max_batch)) {
    const auto next = pc.max_batch_per_gpu > 0 ? sim.simulate(c, pc.max_batch_per_gpu + 1) : at_fit;
    set_limit(pc, worst(next), pc.max_batch_per_gpu + 1);
  }
  if (pc.max_batch_per_gpu > 0) {
    const int world = r.gpus_per_node * r.nodes;
    set_step_time(pc, pytorch_step_time(c, r, file, world, *t.affine[sim.kind_of(c)][0], pc.max_batch_per_gpu,
                                          sim.step_for(c)));
  }
  return pc;
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
    throw std::invalid_argument("--stack pytorch: needs --trace or --model (a model traced in its own Python "
                                "process by pytorch/trace_recorder.py)");
  const bool cuda = r.profile.kind == DeviceKind::kCuda;
  // (A trace for the other kind of device was refused in build_plan.)
  PytorchTraces traces;
  load_traces(r, *file, cuda, traces);
  std::vector<Candidate> candidates = requested_fsdp(r, *file, traces, cuda);
  add_ddp_candidates(r, traces, cuda, candidates);
  check_job(r, *file, candidates);
  // Every input checked: a bad one stays one line.
  if (!traces.amp_not_affine.empty())
    spdlog::warn("--stack pytorch: no {} candidates: the autocast traces are not batch-affine ({})", traces.amp_name,
                 traces.amp_not_affine);
  PytorchJobSim sim(r, *file, traces, budget);

  Plan plan = plan_skeleton(r, file, device_mem, budget);
  plan.schedule = {};  // the engine's schedule options; PyTorch's job is pytorch_job's
  plan.stack = "pytorch";
  plan.ddp_bucket_view = r.ddp_bucket_view;
  plan.ddp_static_graph = r.ddp_static_graph;
  plan.single_gpu_unwrapped = r.single_gpu_unwrapped;
  plan.pytorch_job = Plan::PytorchJob{r.torch, r.zero_grad_set_to_none ? "none" : "zero",
                                      r.ckpt_reentrant ? "reentrant" : "non-reentrant", r.schedule.ddp_bucket_cap_bytes,
                                      r.fsdp_backward_prefetch == FsdpBackwardPrefetch::kBackwardPost ? "post"
                                      : r.fsdp_backward_prefetch == FsdpBackwardPrefetch::kNone       ? "none"
                                                                                                       : "pre",
                                      static_cast<int>(r.steps), r.fsdp_version, r.fsdp_reduce_dtype,
                                      r.adamw_step ? adamw_step_name(*r.adamw_step) : "",
                                      r.fsdp_keep_low_precision_grads, r.fsdp_use_orig_params,
                                      r.loop_keeps_outputs ? "outputs" : "loss"};
  for (const Candidate& c : candidates) plan.candidates.push_back(search_pytorch_candidate(c, r, *file, traces, sim));
  if (sim.foreach_unrecorded())
    spdlog::warn("--trace: no AdamW(foreach=True) steps in the file (recorded since 2026-12-03), the step PyTorch {} "
                 "takes on CUDA when the script passes no foreach: planned with the for-loop step; record the trace "
                 "again for it", r.torch);
  if (auto best = choose(plan.candidates, r.objective)) plan.chosen = plan.candidates[*best].id();
  return plan;
}

}  // namespace shardfit::planner
