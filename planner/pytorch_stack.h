// `shardfit plan --stack pytorch`: one training job as PyTorch's own stack
// runs it, replayed from a model's traces: this file's
// torch.nn.parallel.DistributedDataParallel with torch.optim.AdamW or
// ZeroRedundancyOptimizer(AdamW), on CPU ranks or through the CUDA caching
// allocator's model (PyTorch FSDP: pytorch_fsdp.h), in the loop a PyTorch
// user writes and pytorch/validate.py runs:
//     opt.zero_grad(set_to_none=True); x = batch; loss = model(x);
//     loss.backward(); del loss, x; opt.step()
// What each part of that step allocates comes from traces recorded in the
// model's own Python process (pytorch/trace_recorder.py): the forward and
// backward with no .grad at the start (AccumulateGrad keeps the gradient an
// op made) or with every .grad present, and two steps of torch.optim.AdamW
// itself (its lazily created state and its for-loop temporaries). DDP's
// reducer, which runs beside them, is modelled in pytorch_ddp.cc as the
// actions of its schedule (spec/schedule.h, Runtime::kTorchDdp), each rule
// citing the PyTorch source it follows. torch.utils.checkpoint and autocast are in
// the traces (recorded under them); GradScaler's own tensors are modelled here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/adamw_steps.h"
#include "planner/allocator_model.h"
#include "planner/model_trace.h"
#include "spec/candidate.h"
#include "spec/grad_buckets.h"
#include "spec/schedule.h"
#include "planner/step_simulator.h"

namespace shardfit::planner {

// FullyShardedDataParallel(backward_prefetch=...) (`plan --stack pytorch
// --fsdp-backward-prefetch`): BACKWARD_PRE, BACKWARD_POST or None, as the
// schedule carries it.
using FsdpBackwardPrefetch = spec::BackwardPrefetch;

// Under --stack pytorch a ddp candidate with an auto wrap policy and no
// +ckpt (ddp/PRECISION/wrap=size:N or block; SPEC's alias no_shard) is
// FSDP1's FullyShardedDataParallel(sharding_strategy=NO_SHARD,
// auto_wrap_policy=...); with wrap=none, or +ckpt (the wrap then names what
// is checkpointed), it is DistributedDataParallel.
inline bool fsdp_no_shard(const spec::Candidate& c) {
  return c.sharding == spec::Sharding::kDdp && c.wrap != "none" && !c.recompute;
}

// FSDP's reduce_dtype (`plan --stack pytorch --fsdp-reduce-dtype`, the plan's
// pytorch_job.fsdp_reduce_dtype): "param" (none given: the gradients are
// reduced in the dtype they were computed in, param_dtype's) or "fp32",
// "bf16", "fp16" (MixedPrecision(reduce_dtype=...), or the policy's for
// FSDP2). Anything else: std::invalid_argument.
std::optional<DType> parse_fsdp_reduce_dtype(const std::string& name);

// The PyTorch a job runs (`plan --stack pytorch --torch`, the plan's
// pytorch_job.torch): the pinned stack's (requirements.lock), or 1.13, the
// 2022 reference scenario's.
inline constexpr const char* kPinnedTorch = "2.11";

// What the training loop's calls do when the script passes nothing, by the
// PyTorch that runs it (`--zero-grad` and `--checkpoint` override them).
struct TorchDefaults {
  std::string zero_grad;   // "none" (set_to_none=True) or "zero"
  std::string checkpoint;  // the +ckpt candidates': "non-reentrant" or "reentrant"
};
// `torch`: "2.11" or "1.13"; anything else: std::invalid_argument.
TorchDefaults torch_defaults(const std::string& torch);

// Whether torch.optim.AdamW given no foreach= takes its multi-tensor step
// on a candidate's parameters: 1.13 never (optim/adamw.py: a foreach of None
// is False); 2.x when every parameter is a plain Tensor, Parameter or
// DTensor on CUDA (optim/optimizer.py _default_to_fused_or_foreach and
// _foreach_supported_types, to which torch/distributed/tensor/__init__.py
// adds DTensor): DDP's, ZeroRedundancyOptimizer's and FSDP2's parameters,
// not FSDP1's FlatParameters (`flat_parameters`, use_orig_params=False).
bool adamw_foreach_default(const std::string& torch, bool cuda, bool flat_parameters);

// DistributedDataParallel's default bucket_cap_mb, in bytes: spec's, which
// shardfit's engine buckets by too.
using spec::kDdpBucketCapBytes;

struct PytorchDdpInputs {
  // One batch's forward + backward: grads_at_start false (the default
  // gradient mode) and true (gradient_as_bucket_view: see the .cc).
  const ModelTrace* no_grads = nullptr;
  const ModelTrace* with_grads = nullptr;
  const ModelTrace* optimizer_first = nullptr;  // the optimizer's step 1 (creates its state)
  const ModelTrace* optimizer_later = nullptr;  // any later step
  const ModelTrace* zero_grad = nullptr;        // its zero_grad(set_to_none=True), when recorded
  int64_t param_bytes = 0;  // every parameter (fp32), all requiring grad
  // The model's buffers (named_buffers() order): allocated with the model,
  // broadcast by DDP at construction and before every forward.
  std::vector<BufferInfo> buffers;
  // ZeroRedundancyOptimizer: each parameter's numel and its two steps alone
  // (TraceFile::optimizer_param_steps), in parameters() order.
  std::vector<int64_t> param_numels;
  const std::vector<ModelTrace>* optimizer_param_steps = nullptr;
  // torch.optim.AdamW(foreach=True) or (fused=True) (`plan --adamw-step`):
  // its two steps over every parameter, split, from which zero1's partition
  // and FSDP's shards compose theirs (nullptr: the for-loop AdamW). DDP
  // replays the traced steps themselves (optimizer_first, optimizer_later).
  const MultiTensorAdamwStep* list_step_first = nullptr;
  const MultiTensorAdamwStep* list_step_later = nullptr;
};

struct PytorchDdpOptions {
  bool gradient_as_bucket_view = false;  // DDP(gradient_as_bucket_view=...), default False
  // DDP(bucket_cap_mb=...) in bytes: the rebuilt buckets' size (the first
  // iteration's one bucket and the 1 MiB first bucket do not depend on it).
  int64_t bucket_cap_bytes = kDdpBucketCapBytes;
  // torch.distributed.optim.ZeroRedundancyOptimizer(AdamW) instead of AdamW:
  // this rank's optimizer holds its partition of the parameters only.
  bool zero_redundancy = false;
  int world_size = 1;
  int rank = 0;
  int steps = 2;                         // training steps after init (step 2 on repeats)
  int64_t budget_bytes = INT64_MAX;      // an allocation past it is out of memory
  // The CUDA caching allocator (a CUDA profile) instead of the exact one.
  bool cuda_caching = false;
  // Allocations that exist before the model (the profile's cuBLAS workspaces).
  std::vector<int64_t> overhead_bytes;
  // opt.zero_grad(set_to_none=...): True drops every .grad (PyTorch 2.x's
  // default, and pytorch/validate.py's loop); False zeroes them in place, so
  // they stay allocated from step 1's backward on (PyTorch 1.x's default).
  bool zero_grad_set_to_none = true;
  // What the loop keeps of the forward's return until the next forward:
  // everything (`outputs = model(x)` in its body, pytorch/validate.py's
  // loop) or, false, the loss alone (`loss = loss_fn(model, x)`).
  bool keep_outputs = true;
  // torch.cuda.amp.GradScaler around the step (the fp16 candidates: AMP's
  // recipe, as Accelerate's fp16 ran it): its scale and growth tracker,
  // unscale_'s tensors around the optimizer step (grad_scaler_step_bytes).
  // The traces carry `scaler.scale(loss).backward()` itself.
  bool grad_scaler = false;
  // Micro-batches per optimizer step, all but the last under DDP.no_sync()
  // (the loop: for each micro-batch, outputs = model(x); loss.backward();
  // then opt.step()). Timeline points "stepK.M/forward", "stepK.M/backward"
  // per micro-batch M when above 1. Not with gradient_as_bucket_view.
  int grad_accum = 1;
  // DDP(static_graph=True) (distributed.py / reducer.cpp, 1.13): the
  // reducer's local_used_map_ and local_used_map_dev_ (an int32 per
  // parameter each, made by set_static_graph, kept); in the first synced
  // iteration _DDPSink clones every tensor the forward returns
  // (ModelTrace::output_tensor_bytes; the originals go as DDP.forward
  // returns) and the gradients are reduced only as the backward ends
  // (delay_all_reduce), so with gradient_as_bucket_view each op's gradient
  // stays .grad until then.
  bool static_graph = false;
  // False: the model runs unwrapped, as Accelerate (accelerator.py
  // prepare_model wraps in DDP only for DistributedType.MULTI_GPU) and the
  // Hugging Face Trainer leave a one-process job: no Reducer buckets, no
  // parameter or buffer broadcasts; AdamW and the loop as with DDP. Only on a
  // world of one, and not with the DDP options above (static_graph,
  // gradient_as_bucket_view, zero_redundancy).
  bool wrapped = true;
};

// torch.cuda.amp.GradScaler (PyTorch 1.13, torch/cuda/amp/grad_scaler.py)
// as the allocator sees it, in bytes, each a 1-element tensor:
//  - scale(): on its first call, _lazy_init_scale_growth_tracker makes
//    `_scale` (float32) and `_growth_tracker` (int32); they live on;
//  - step() -> unscale_(): `inv_scale = self._scale.double().reciprocal()
//    .float()` (a float64, its reciprocal, the first freed as the second is
//    cast, then the float64 reciprocal freed), `found_inf = torch.full((1,),
//    0.0)`; _unscale_grads_ copies both for the device (_MultiDeviceReplicator
//    .get: `.to(device, copy=True)`, found_inf's first) and unscales every
//    gradient in place (_amp_foreach_non_finite_check_and_unscale_); the
//    inv_scale copy goes as _unscale_grads_ returns, inv_scale and found_inf
//    as unscale_ returns; the found_inf copy, kept in the optimizer's state,
//    goes in update() after the optimizer step (_per_optimizer_states reset).
//    update()'s `.to(same device)` and _amp_update_scale_ allocate nothing.
// A step whose gradients overflow skips optimizer.step(); the plan assumes
// the steady state, where steps are taken (AdamW's state exists from then on).
inline constexpr int64_t kGradScalerScaleBytes = 4, kGradScalerGrowthTrackerBytes = 4;
// GradScaler.unscale_ (torch/distributed/fsdp/sharded_grad_scaler.py's
// ShardedGradScaler the same on GPU gradients): allocates and frees its GPU
// tensors in order, leaving the found_inf copy the optimizer's state keeps
// in `found_inf_copy` (none with `host_grads`: ShardedGradScaler over
// offloaded gradients makes its copies on the host and all-reduces a GPU
// copy of found_inf). Then update(), after the step: the copy freed; with
// host_grads the host copy brought to the GPU for _amp_update_scale_ and
// dropped. False on out of memory.
// scale()'s first call makes `_scale` and `_growth_tracker` (grad_scaler_init).
class Ledger;
bool grad_scaler_init(Ledger& ledger, const std::string& label);
bool grad_scaler_unscale(Ledger& ledger, const std::string& label, int64_t& found_inf_copy, bool host_grads);
bool grad_scaler_update(Ledger& ledger, const std::string& label, int64_t found_inf_copy, bool host_grads);

// Replays init (the model, DDP's buckets) and `steps` training steps through
// an exact allocator (the bytes each storage asks for, as the CPU meter
// counts), recording a timeline point per phase with the labels
// pytorch/validate.py marks: "init", "stepK/forward", "stepK/backward",
// "stepK/optimizer". Stops at the first allocation past the budget.
StepSimResult simulate_pytorch_ddp(const PytorchDdpInputs& inputs, const PytorchDdpOptions& options);
// The same through `allocator` (reset first); options.budget_bytes and
// cuda_caching are the allocator's business then.
StepSimResult simulate_pytorch_ddp(const PytorchDdpInputs& inputs, const PytorchDdpOptions& options,
                                   AllocatorModel& allocator);

// torch.distributed's _broadcast_coalesced (PyTorch 1.13, c10d comm.cpp
// broadcast_coalesced), as the allocator sees it: the tensors cut into
// buckets by dtype, a bucket closed once it holds `bucket_bytes` or more
// (reducer.cpp compute_bucket_assignment_by_size; buckets in the order of
// their first tensor); each bucket flattened into one new tensor of its bytes
// (torch/csrc/utils/tensor_flatten.h flatten_dense_tensors: at::cat, or a
// view when the bucket holds one tensor), at most two buckets in flight, each
// freed once broadcast and copied back. Returns the bytes each bucket's flat
// tensor allocates (0 for a view), in the order they are made.
struct CoalescedTensor {
  std::string dtype;
  int64_t bytes = 0;
};
std::vector<int64_t> broadcast_coalesced_flats(const std::vector<CoalescedTensor>& tensors, int64_t bucket_bytes);
// The bytes Reducer::sync_bucket_indices (reducer.cpp, 1.13) holds while
// DDP's first forward after the first iteration rebuilds its buckets: the
// bucket indices and the bucket sizes as int32 tensors, each with a copy
// for the process group ("indices_tensor_device", "bucket_sizes_tensor_
// device"), all four alive until it returns: 2 x 4 x (parameters + 1) +
// 2 x 4 x buckets. The buckets: compute_bucket_assignment_by_size over the
// parameters in the order their gradients became ready (taken as the
// reverse of parameters()), cut at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB)
// for the first and bucket_cap_mb (25 MiB) after (distributed.py).
int64_t ddp_rebuild_sync_bytes(const std::vector<int64_t>& param_numels, int64_t bucket_cap_bytes = kDdpBucketCapBytes);
std::vector<int64_t> ddp_rebuild_sync_tensors(const std::vector<int64_t>& param_numels, size_t buckets);
// The rebuilt buckets' bytes, in the order they are made (after the 1 MiB
// first bucket, each closed once it holds bucket_cap_bytes:
// DDP(bucket_cap_mb=...) as int(bucket_cap_mb * 1024 * 1024)).
std::vector<int64_t> ddp_bucket_bytes(const std::vector<int64_t>& param_numels,
                                      int64_t bucket_cap_bytes = kDdpBucketCapBytes);
inline constexpr int kBroadcastMaxInFlight = 2;       // comm.cpp: max_in_flight
inline constexpr int64_t kDdpBroadcastBucketBytes = 250LL << 20;  // distributed.py: broadcast_bucket_size

// ZeroRedundancyOptimizer's partition (PyTorch 1.13,
// torch/distributed/optim/zero_redundancy_optimizer.py _partition_parameters):
// parameters sorted by numel, largest first (a stable sort), each given to
// the rank with the fewest elements so far (the lowest such rank). Returns,
// per rank, its parameters' indices in the order its local optimizer holds
// them.
std::vector<std::vector<int>> zero_redundancy_partition(const std::vector<int64_t>& numels, int world_size);

}  // namespace shardfit::planner
