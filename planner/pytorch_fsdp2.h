// `shardfit plan --stack pytorch --fsdp-version 2`:
// PyTorch's FSDP2, `fully_shard` (torch.distributed.fsdp.fully_shard; in
// torch/distributed/fsdp/_fully_shard/), applied to every block and then to
// the root (wrap=block), or to the root alone (wrap=none), with
// reshard_after_forward=True (zero3) or False (zero2), on a 1-D mesh or a
// 2-D one (HSDP), CPUOffloadPolicy or not, MixedPrecisionPolicy(param_dtype=
// d, reduce_dtype=None or torch.float32) or none, and torch.optim.AdamW over the sharded parameters, in the loop
//     opt.zero_grad(); loss = model(x)[0]; loss.backward(); opt.step()
// on CUDA ranks through the caching allocator's model, one pool per stream
// FSDP2 allocates on, or (zero2 and zero3, fp32, 1-D mesh) on CPU ranks over
// Gloo through the exact allocator. Each rule in the .cc cites the file it
// follows, read at PyTorch's main branch: _fsdp_collectives.py and
// _fsdp_param.py at commit 010ae4a8, _fsdp_param_group.py at 002a76fb,
// _fsdp_state.py at 01c9f4fc; where torch 2.11 (the pinned stack) differs,
// 2.11's: the root resharded after its forward when reshard_after_forward is
// passed to it, and foreach_reduce's last gradient held until it returns.
// Which actions its hooks take, and in which order, is spec::Schedule's
// (spec/schedule.h, Runtime::kTorchFsdp2), the table the engine's hooks
// come from; the .cc says what each action allocates here.
//
// Unlike 1.13's FSDP (pytorch_fsdp.h) FSDP2 shards each parameter on its own
// dim 0 (a DTensor): no flat parameter is kept, the all-gather's flat buffer
// and the reduce-scatter's are made per collective, and a group's gradients
// on each rank are views of one flat reduce-scatter output. Not in Debian's
// PyTorch 1.13; torch 2.11's fully_shard measured on an H200 by
// scripts/fsdp_reference.py (reports/gpu/README.md), not yet held against
// this model there; on CPU ranks held against real 2.11 jobs, every peak to
// the byte (scripts/pytorch-validate's fsdp2 wraps, docs/pytorch-fsdp.md).
#pragma once

#include <cstdint>
#include <vector>

#include "planner/allocator_model.h"
#include "planner/model_trace.h"
#include "planner/pytorch_stack.h"
#include "planner/step_simulator.h"
#include "spec/schedule.h"

namespace shardfit::planner {

struct PytorchFsdp2Options {
  // fully_shard(reshard_after_forward=True): each block's parameters freed
  // after its forward and gathered again for its backward (zero3); False
  // keeps them from the forward to the end of the block's backward (zero2).
  // The root is resharded after its forward only with
  // reshard_root_after_forward (below).
  bool reshard_after_forward = true;
  // The root too resharded after its forward (and gathered again when its
  // backward begins). torch 2.11's _fsdp_state.py _lazy_init keeps the root
  // unsharded only when its fully_shard was called with
  // reshard_after_forward left None (_auto_reshard_after_forward); given
  // explicitly, as `plan` assumes (reshard_after_forward=True for zero3, on
  // the blocks and the root alike), the root's group reshards as any other.
  bool reshard_root_after_forward = false;
  // CPUOffloadPolicy: the sharded parameters, their gradients and AdamW on
  // the host.
  bool offload_params = false;
  // CPUOffloadPolicy on a CPU mesh, where the host is the device: nothing
  // moves, but each parameter's all-gather input is its own cast (the
  // offload branch of _get_param_all_gather_inputs), not the foreach copy.
  bool offload_on_host = false;
  // fully_shard on every block (ModuleNode::is_block), then on the root; or
  // on the root only.
  bool wrap_blocks = true;
  // MixedPrecisionPolicy(param_dtype=d): gathered, computed with and reduced
  // in d (the traces are the model's cast to d, as for FSDP1's
  // MixedPrecision), the shards and the gradients' shards fp32. kF32: none.
  DType mixed_precision = DType::kF32;
  // ShardedGradScaler around the step (fp16), as for FSDP1
  // (PytorchFsdpOptions::grad_scaler).
  bool grad_scaler = false;
  // MixedPrecisionPolicy(reduce_dtype=d): gradients reduce-scattered in d
  // (fp32 beside a low param_dtype is torchtitan's recipe; bf16 beside fp32
  // parameters halves the reduce-scatter), the output cast to fp32 unless d
  // is. None: reduce_dtype None, so param_dtype's.
  std::optional<DType> reduce_dtype;
  // HSDP (the hybrid candidates: fully_shard(mesh=2-D DeviceMesh)): sharded
  // within a group of world_size ranks (a node), replicated across groups;
  // each reduce-scatter's output then all-reduced across the replicas.
  bool hsdp = false;
  // `--prefetch N` (spec::ScheduleOptions::prefetch): 1, FSDP2's
  // defaults (no forward prefetch, the implicit one-group backward
  // prefetch); N >= 2, explicit prefetching as PyTorch's FSDP2 example sets
  // it on the blocks: block i's set_modules_to_forward_prefetch(
  // blocks[i+1 .. i+N-1]) and, from block N on,
  // set_modules_to_backward_prefetch(blocks[i-1 .. i-N]); a block with no
  // backward list keeps the implicit prefetch, as the root does.
  int prefetch = 1;
  // CPU ranks (Gloo): no caching allocator, so what a CUDA job's cache
  // hides is counted: the model built whole before fully_shard shards it.
  bool cpu = false;
  int world_size = 2;  // the shard group's size (with hsdp, the ranks of a node)
  int steps = 2;
  std::vector<int64_t> overhead_bytes;  // the profile's cuBLAS workspaces
  bool zero_grad_set_to_none = true;    // opt.zero_grad(set_to_none=...)
  bool keep_outputs = true;             // PytorchDdpOptions::keep_outputs
};

// The streams whose pools the caching allocator keeps apart: the default
// (compute) stream, the all-gather copy-in stream (where the all-gather's
// inputs and output are made), the reduce-scatter stream (its output) and,
// with HSDP, the all-reduce stream (the output cast to fp32 after it).
enum Fsdp2Stream : int {
  kFsdp2ComputeStream = 0,
  kAllGatherCopyInStream = 1,
  kReduceScatterStream = 2,
  kAllReduceStream = 3
};

// A parameter's padded shard, in elements: dim 0 cut as torch.chunk cuts it
// into world pieces, every rank's padded to the 0th chunk (_fsdp_param.py
// _init_sharded_param: padded_sharded_size = chunks[0].size()), i.e.
// ceil(dim0 / world) rows of the other dims. Rank 0's shard is unpadded at
// that size, so rank 0 is the rank simulated (its AdamW state the largest).
int64_t fsdp2_shard_numel(const ParamInfo& p, int world);

// One rank's (rank 0's) init and `steps` steps; `in` as for
// simulate_pytorch_fsdp (the no-grads trace, each parameter's optimizer
// steps), `modules` the trace file's module table.
StepSimResult simulate_pytorch_fsdp2(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                     const PytorchFsdp2Options& options, AllocatorModel& allocator);

}  // namespace shardfit::planner
