// `shardfit plan --stack pytorch` for PyTorch's FullyShardedDataParallel:
// torch.distributed.fsdp as of 1.13
// (Debian's python3-torch; its source, torch/distributed/fsdp/
// fully_sharded_data_parallel.py and flat_param.py, is what each rule below
// cites), wrapping by size_based_auto_wrap_policy(min_num_params),
// FULL_SHARD or SHARD_GRAD_OP, CPUOffload(offload_params) or not, with
// MixedPrecision(param_dtype = buffer_dtype, reduce_dtype the same or fp32,
// keep_low_precision_grads or not) or not, with
// torch.optim.AdamW over the flat parameters, in the loop
//     opt.zero_grad(); loss = model(x)[0]; loss.backward(); opt.step()
// on CUDA ranks (1.13's FSDP runs only there), through the CUDA caching
// allocator's model with one pool per stream FSDP uses. Checked by hand
// against 1.13's source; torch 2.11's FSDP1 on an H200 measured otherwise
// (reports/gpu/README.md: its own kernels and allocator), not yet modelled.
// A world size of 1 runs as NO_SHARD, as 1.13 clamps it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/allocator_model.h"
#include "planner/model_trace.h"
#include "planner/pytorch_stack.h"
#include "planner/step_simulator.h"
#include "spec/wrap_policy.h"

namespace shardfit::planner {

struct PytorchFsdpOptions {
  // ShardingStrategy.FULL_SHARD (parameters freed after each unit's forward
  // and gathered again for its backward) or SHARD_GRAD_OP (kept from the
  // forward until the unit's backward is done).
  bool reshard_after_forward = true;
  bool offload_params = false;  // CPUOffload(offload_params=True): shards, grads and AdamW on the host
  // auto_wrap_policy: size_based_auto_wrap_policy(min_num_params) (kSize;
  // its default 1e8), or transformer_auto_wrap_policy with the trace's block
  // class as transformer_layer_cls (kBlock: wrap.py wraps every instance and
  // recurses everywhere else; the root wraps what remains).
  spec::WrapPolicy wrap{spec::WrapPolicy::Kind::kSize, 100000000};
  // BackwardPrefetch: BACKWARD_PRE (gather the next unit when this unit's
  // backward starts), BACKWARD_POST (when it ends) or none.
  using Prefetch = FsdpBackwardPrefetch;
  Prefetch backward_prefetch = Prefetch::kBackwardPre;
  // FSDP(forward_prefetch=True) (`--prefetch 2`): each unit's pre-forward
  // gathers the next unit in the forward order the first iteration recorded
  // (_ExecOrderData, forward_prefetch_limit 1), so from step 2 on.
  bool forward_prefetch = false;
  // MixedPrecision(param_dtype=d, reduce_dtype=d, buffer_dtype=d), d bf16
  // or fp16 (with grad_scaler), or none (kF32). With one, the traces are
  // the model's cast to d (trace_recorder.py --param-dtype): FSDP computes
  // with the gathered low-precision flat parameter (NO_SHARD: the whole one
  // cast), so activations and the parameters' gradients are d; the shards,
  // the reduced gradient shards and AdamW stay fp32.
  DType mixed_precision = DType::kF32;
  // MixedPrecision(reduce_dtype=d) (`--fsdp-reduce-dtype`), d other than
  // the dtype the gradients are computed in (param_dtype, or fp32 without
  // one): the flat gradient cast to d before its reduce-scatter, which then
  // runs in d; the reduced shard cast to fp32 unless d is. None: reduced
  // in param_dtype.
  std::optional<DType> reduce_dtype;
  // MixedPrecision(keep_low_precision_grads=True) (`--fsdp-keep-low-precision-
  // grads`): _finalize_params casts each reduced fp32 shard to param_dtype
  // for the optimizer.
  bool keep_low_precision_grads = false;
  // ShardedGradScaler around the step (fp16 MixedPrecision, as FSDP's docs
  // pair them: torch/distributed/fsdp/sharded_grad_scaler.py): its scale and
  // growth tracker from the first scale(), unscale_'s tensors around the
  // optimizer step (grad_scaler_unscale, the gradients on the host with
  // offload_params). The traces carry the scaled loss's backward.
  bool grad_scaler = false;
  // CPU ranks (Gloo, FullyShardedDataParallel(device_id=cpu)): no caching
  // allocator, so the construction's transients count (the .cc's init).
  bool cpu = false;
  int world_size = 2;
  int steps = 2;
  int64_t budget_bytes = kUnlimitedBytes;
  std::vector<int64_t> overhead_bytes;  // the profile's cuBLAS workspaces
  bool zero_grad_set_to_none = true;    // opt.zero_grad(set_to_none=...)
};

// The streams whose pools the caching allocator keeps apart (a block freed
// on one is not reused by another): the default (compute) stream and the
// three FSDP creates in _init_streams.
enum FsdpStream : int { kFsdpComputeStream = 0, kAllGatherStream = 1, kPostBackwardStream = 2, kPreAllGatherStream = 3 };

// One rank's init and `steps` steps; `in` as for simulate_pytorch_ddp (its
// no-grads traces and per-parameter optimizer steps are used), `modules` the
// trace file's module table.
StepSimResult simulate_pytorch_fsdp(const PytorchDdpInputs& in, const std::vector<ModuleNode>& modules,
                                    const PytorchFsdpOptions& options, AllocatorModel& allocator);

// What FSDP1 and FSDP2 (`who`) need of the trace file and the options: the
// no-grads traces and each parameter's optimizer steps, a world and a step.
// Else std::invalid_argument.
void check_fsdp_request(const PytorchDdpInputs& in, int world_size, int steps, const std::string& who);

// A unit's flat parameter, padded and sharded (flat_param.py _get_shard:
// torch.chunk into world_size pieces, each rank's padded to the first's
// numel): the shard's numel, ceil(numel / world).
inline int64_t fsdp_shard_numel(int64_t numel, int world) { return (numel + world - 1) / world; }

// What both FSDP versions share (FSDP1 here, FSDP2's fully_shard in
// pytorch_fsdp2.h; defined in pytorch_fsdp_walk.cc): AdamW over shards, the
// gradients of a tie split across units, and one step's walk through the
// no-grads trace, calling the version's hooks where PyTorch calls them.
class Ledger;
// torch.optim.AdamW over shards of these sizes (elements; a 0 is skipped),
// in this order, from the traced steps of one parameter alone (`in`'s
// optimizer_param_steps), resized: its first step (state created) and any
// later one.
struct ShardedAdamw {
  ModelTrace first, later;
};
ShardedAdamw sharded_adamw_steps(const PytorchDdpInputs& in, const std::vector<int64_t>& shards);
struct FsdpStepHooks {
  std::function<void(int)> pre_forward;   // a unit's forward begins (its forward pre-hook)
  std::function<void(int)> post_forward;  // a unit's forward has ended (its forward hook)
  std::function<void()> backward_begins;  // the forward returned: the root's pre-backward hook
  std::function<void(int)> pre_backward;  // a unit's backward begins (the hook on its outputs' gradients)
  std::function<void(int)> post_backward; // a unit's backward has ended (its inputs' gradients are ready)
  // FSDP1: post_backward is the hook on the flat parameter's AccumulateGrad,
  // which runs once the backward of the views the unit's pre-forward made
  // (_use_unsharded_views) has run; the autograd engine runs the ready node
  // made latest first, and those views were made just before the unit's
  // modules ran, so they run right after its last parameter gradient. For a
  // unit whose inputs need no gradient (an embedding's ids) the trace has no
  // end of its backward until the whole backward's (the tracer's markers sit
  // on inputs that need one): with this set, such a unit's post_backward
  // runs after its last gradient and the frees its node makes (inside an
  // op), before the next allocation, module event or free outside any op
  // (the graph's teardown at the backward's end). Not the root's: its views
  // were made before any other node, so they run last, at the backward's
  // end. FSDP2 waits for the backward's end for such a unit too (its root's
  // final callback), as the trace does.
  bool post_backward_after_last_grad = false;
  // The backward's last op has run: what the autograd engine calls before
  // the graph is torn down (the frees outside any op that end the trace's
  // backward: storages only the graph held, e.g. transformers' ids, mask
  // and a scalar), such as FSDP2's _root_post_backward_final_callback,
  // queued on the engine. Unset: nothing.
  std::function<void()> backward_ends;
};
// The gradients of a tie split across units (FSDP1's kCopiedPerUnit: each
// unit that registers the weight flattens its own copy), each its module's
// unit's, kept until that unit's flat gradient is made. In the traces (one
// parameter) the borrower's backward runs first: its gradient becomes the
// parameter's .grad, and the owner's own gradient is added into it and
// freed; the borrower's is freed only then, in the owner's backward.
// Empty when every tie is inside one unit.
struct SplitTieGrads {
  std::unordered_map<int, int64_t> owner_bytes;  // owner module -> its own gradient's bytes
  struct Borrowed {
    int owner = -1;     // the module that owns the weight
    int64_t bytes = 0;  // the gradient's bytes
  };
  std::unordered_map<int, Borrowed> borrowers;  // borrowing module -> its gradient
};
SplitTieGrads split_tie_grads(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part,
                              int64_t element_bytes);
// Replays the trace's storages on the compute stream (0) into `ledger`,
// labelled `label` (stepK/forward, then stepK/backward: the hooks allocate
// under it too). The parameters' gradients (kept by AccumulateGrad; an
// owner's own gradient of a split tie) are appended to unit_grads[unit] and
// left for post_backward to free; what the forward returns beside the loss
// is appended to `outputs`, and `previous_outputs` (the last step's) freed
// when the forward returns, where a point stepK/forward is recorded. The
// units' forward order is appended to `forward_order` when it is given.
// With `grad_origins`, each gradient's (module, bytes) is appended to
// (*grad_origins)[unit] beside its id in unit_grads. False on out of memory.
bool walk_fsdp_step(const ModelTrace& t, const spec::UnitPartition& part, const SplitTieGrads& split_ties,
                    const std::string& step,
                    std::string& label, const FsdpStepHooks& hooks, Ledger& ledger,
                    std::vector<std::vector<int64_t>>& unit_grads, std::vector<int64_t>& outputs,
                    std::vector<int64_t>& previous_outputs,
                    std::vector<std::vector<std::pair<int, int64_t>>>* grad_origins = nullptr);

}  // namespace shardfit::planner
