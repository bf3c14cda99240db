// One wrapped unit's flat parameter (FSDP's FlatParamHandle): the unit's
// parameters flattened and padded by spec::FlatParamLayout — the same
// description the StepSimulator charges — with this rank's fp32 shard, the
// gathered compute-dtype buffer every original parameter is a view of, the
// gradient buffers, and the unit's AdamW state. Each method is one of the
// simulator's transitions and allocates exactly what the simulator charges
// for it (planner/step_simulator.h is the specification), in the same order:
//
//   sharded params (zero2/zero3/hybrid)       full params (ddp/zero1)
//   init: fp32 shard 4*s (host if offload)    init: fp32 flat 4*P [+ c*P compute copy]
//   unshard: [c*s staging] + c*P gathered      zero1+offload: host fp32 shard, device c*P
//   reshard: gathered storage freed            grads: views into the engine's flat grad
//   alloc_unsharded_grad: c*P                  buckets: all-reduced in place (engine)
//   reduce_grad: fp32 shard grad 4*s (mixed:   optimizer: AdamW on the full param (ddp)
//     via a c*s reduce-scatter output)           or this rank's slice (zero1), then
//   optimizer: AdamW on the shard                all-gather in place
//
// "Host" memory (offload) is allocated under ScopedUntracked: on the CPU it
// is the same RAM, but it is not the device being emulated. Staging copies
// between host and device are tracked, as the simulator charges them. On
// CUDA the host is the CPU: the fp32 master shard and shard grads are in
// pinned memory (the copies to and from the device are DMA, no bounce
// buffer), AdamW's state in ordinary host memory; the CUDA meter sees only
// the device.
//
// Freeing the gathered buffer frees its STORAGE (FSDP's _free_storage):
// the StorageImpl keeps its identity and goes to zero bytes, so the views
// autograd saved for backward stay valid and see the data again when the
// next unshard refills the same StorageImpl with a fresh allocation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "executor/adamw.h"
#include "executor/comm.h"
#include "spec/shard_layout.h"

namespace shardfit::executor {

// Where a unit's state lives, by strategy.
struct FlatParamConfig {
  // zero2/zero3/hybrid: only the fp32 shard persists; the compute-dtype
  // params exist between unshard() and reshard().
  bool sharded_params = false;
  // zero1: full params and grads, AdamW on this rank's slice (the layout's
  // shard) only. Ignored when sharded_params (always sharded there).
  bool shard_optimizer = false;
  // fp32 master shard, shard grads and AdamW state on the host.
  bool offload = false;
  // What forward/backward compute in: kFloat, or kBFloat16/kHalf (mixed
  // precision, with fp32 master weights and optimizer state).
  c10::ScalarType compute_dtype = torch::kFloat;
  // Where the device state lives (cpu, or cuda:i); offloaded state is on
  // the host either way.
  c10::Device device = torch::kCPU;
};

// FSDP2's parameter states. SHARDED_POST_FORWARD (resharding onto a smaller
// group after forward) is not a strategy here.
enum class ParamState : uint8_t {
  kSharded,    // only the shard exists; the gathered storage has 0 bytes
  kUnsharded,  // the gathered c*P buffer holds every rank's shard
};

class FlatParam {
 public:
  // Where initial values come from: fills `dst` (contiguous, the unit's
  // buffer dtype and device) with elements [offset, offset + dst.numel())
  // of parameter `param` (an index into the layout), flattened.
  using ValueSource = std::function<void(size_t param, int64_t offset, const torch::Tensor& dst)>;

  // `params` are the unit's parameters in layout order: the model's own
  // tensors. Allocates this unit's init memory, fills this rank's part of
  // it, and points every parameter at its view of the compute buffer
  // (param.set_data: the parameter stays the same autograd leaf). The values
  // come from `values`, or, when it is empty, from the parameters themselves
  // (then holding the full fp32 initial values, built untracked). With a
  // ValueSource the parameters may be on the meta device: only the part
  // this rank keeps is ever read. `rank` is this rank in the shard group
  // (0 for ddp).
  FlatParam(std::string name, spec::FlatParamLayout layout, int rank, FlatParamConfig config,
            const std::vector<torch::Tensor>& params, const ValueSource& values = {});
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;

  const std::string& name() const { return name_; }
  const spec::FlatParamLayout& layout() const { return layout_; }
  const FlatParamConfig& config() const { return config_; }
  ParamState state() const { return state_; }
  // This rank's index in the layout's shard group (0 for ddp).
  int shard_rank() const { return rank_; }
  int64_t padded_numel() const { return layout_.padded_numel(); }
  int64_t shard_numel() const { return layout_.shard_numel(); }

  // ---- sharded params (zero2/zero3/hybrid) --------------------------------
  // SHARDED -> UNSHARDED: all-gather the shard (through a c*s staging copy
  // when it must be cast or comes from the host) into a fresh allocation of
  // the gathered storage. No-op when UNSHARDED.
  void unshard(Communicator& shard_group);
  // unshard in two halves, for a prefetched gather that runs beside compute
  // (--async-gather): the launch allocates the staging copy and the gathered
  // storage and issues the all-gather; finish (or unshard, or reshard)
  // waits for it and frees the staging copy. The parameters may not be read
  // in between.
  void launch_unshard(Communicator& shard_group);
  void finish_unshard();
  bool gather_in_flight() const { return gather_ != nullptr; }
  // UNSHARDED -> SHARDED: free the gathered storage; the shard was never
  // gone. No-op when SHARDED.
  void reshard();
  // The c*P gradient buffer AccumulateGrad adds into: every parameter's
  // .grad becomes a view of it (zeroed).
  void alloc_unsharded_grad();
  bool has_unsharded_grad() const { return unsharded_grad_.defined(); }

  // ---- full params (ddp/zero1) --------------------------------------------
  // Points every parameter's .grad at its view of `flat_grad` (this unit's
  // c*P slice of the engine's flat gradient buffer).
  void attach_flat_grad(const torch::Tensor& flat_grad);
  // The engine all-reduces the flat grad by DDP bucket (spec/grad_buckets.h),
  // not by unit; once every bucket over this unit's slice is reduced,
  // zero1+offload copies this rank's slice to its host fp32 shard grad
  // (nothing otherwise).
  void grads_reduced();

  // ---- gradients -----------------------------------------------------------
  // Post-backward. Sharded: reduce-scatter (avg) the unsharded grad over
  // `group` into the fp32 shard grad (adding to it when it already holds a
  // micro-batch's), all-reduce it across `replicate` (hybrid) and free the
  // unsharded grad (the schedule's kReshard follows). Full params reduce by
  // bucket instead (attach_flat_grad, grads_reduced): a logic_error here.
  void reduce_grad(Communicator& group, Communicator* replicate);
  // reduce_grad in two halves, for a reduction that runs beside the rest of
  // backward (spec/schedule.h: kReduceScatter / kAllReduce launch, and
  // kWaitReduce finishes). The launch allocates the reduction's output (the
  // fp32 shard grad, or the c*s output when mixed or offloaded) and issues
  // it; nothing may touch this unit's grads until finish_reduce_grad, which
  // waits for it and does the rest (upcast or host copy, the replicas'
  // all-reduce, the unsharded grad freed). finish is a no-op when nothing is
  // in flight; a second launch before it is a logic_error.
  void launch_reduce_grad(Communicator& group, Communicator* replicate);
  void finish_reduce_grad();
  bool reduce_in_flight() const { return pending_ != nullptr; }
  // zero_grad(set_to_none=True) for shard grads; full-param strategies zero
  // their flat grad themselves (the engine owns it).
  void free_shard_grad();

  // The gradient the optimizer reads, whatever its dtype: the fp32 shard
  // grad (sharded, zero1+offload) or the flat grad slice (ddp: all of it;
  // zero1: this rank's part). Undefined before the first backward.
  torch::Tensor optimizer_grad() const;

  // ---- optimizer ------------------------------------------------------------
  // AdamW (executor/adamw.h's arithmetic) on the fp32 master: state created
  // lazily (2 x 4 bytes per element), an fp32 copy of a low-precision grad,
  // sqrt(v) + eps as the one temporary (all on the host under offload).
  // Then zero1 all-gathers the updated slices in place (zero1+offload:
  // through a c*s staging copy) and mixed ddp/zero1 refresh their compute
  // copy in place. `group` is the world for ddp/zero1.
  void optimizer_step(const AdamWOptions& options, int64_t step, Communicator& group);

  // fp32 master values of this rank (shard or full param), for tests and
  // the checkpoint writer: a tensor on the device or the host.
  torch::Tensor master() const;
  // Creates the AdamW state (zeros) where the first optimizer step would,
  // with the same bytes: on the device, or on the host under offload. A
  // resumed run loads its saved state into these. No-op when it exists.
  void ensure_optimizer_state();
  // After master() changed outside the optimizer (a checkpoint was loaded
  // into it): brings what forward reads up to date as the end of an
  // optimizer step does — zero1 all-gathers the slices over `group` (the
  // world), mixed ddp/zero1 refresh their compute copy. Sharded params
  // gather from the shard at the next unshard anyway.
  void publish_master(Communicator& group);
  // AdamW state of master(); undefined before the first optimizer step.
  torch::Tensor& exp_avg() { return exp_avg_; }
  torch::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  std::vector<torch::Tensor>& params() { return params_; }

 private:
  bool staged_gather() const;
  void alloc_storage();
  void free_storage();
  void point_params_at(const torch::Tensor& flat);

  std::string name_;
  spec::FlatParamLayout layout_;
  int rank_;
  FlatParamConfig config_;
  bool mixed_;
  int64_t c_bytes_;
  torch::TensorOptions dev_f32_;      // fp32 on config_.device
  torch::TensorOptions dev_compute_;  // the compute dtype on config_.device
  torch::TensorOptions host_f32_;     // fp32 on the host: pinned when the device is a GPU
  std::vector<torch::Tensor> params_;  // the model's parameters, views into the compute buffer
  ParamState state_ = ParamState::kUnsharded;

  // sharded params
  torch::Tensor shard_;            // fp32 [s], device or host: the master
  c10::Storage gathered_storage_;  // c*P bytes when UNSHARDED, 0 when SHARDED
  torch::Tensor gathered_;         // [P] on gathered_storage_: the all-gather output
  std::unique_ptr<PendingCollective> gather_;  // launch_unshard to finish_unshard
  torch::Tensor staging_;          // [s] compute dtype: what gather_ reads (mixed, offload)
  torch::Tensor unsharded_grad_;   // [P] compute dtype, pre- to post-backward
  torch::Tensor shard_grad_;       // fp32 [s], device or host, post-backward to zero_grad
  // A reduction in flight (launch_reduce_grad to finish_reduce_grad): its
  // handle, its output, whether that output is added into shard_grad_ (a
  // later micro-batch), and the replicas' group it is all-reduced over next.
  std::unique_ptr<PendingCollective> pending_;
  torch::Tensor reduce_out_;
  bool reduce_adds_ = false;
  Communicator* pending_replicate_ = nullptr;

  // full params
  torch::Tensor full_;     // fp32 [P] master (ddp, zero1 without offload)
  torch::Tensor compute_;  // [P] compute dtype: what params view (mixed, zero1+offload)
  torch::Tensor flat_grad_;  // [P] slice of the engine's flat grad
  torch::Tensor host_master_;  // zero1+offload: fp32 [s] on the host

  // AdamW state, lazily
  torch::Tensor exp_avg_, exp_avg_sq_;
};

// AdamW's update of one fp32 tensor, exactly executor::AdamW's arithmetic.
// Allocates one temporary (the denominator) through the current allocator;
// the scalar operands LibTorch wraps into tiny CPU tensors are not counted
// (on a GPU they are kernel arguments, not device memory).
void adamw_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq, int64_t step, const AdamWOptions& options);

// Allocation-free helpers for any floating dtype (raw loops: no temporaries,
// no type-promotion copies, which the meter would see). On a GPU they are
// ATen ops instead: sum_of_squares and all_finite reduce to one fp32 scalar
// (a 512-byte block; a half/bf16 input is read as fp32 inside the kernel,
// not copied), multiply_in_place and add_into_fp32 run in place (CUDA
// kernels cast operands as they read them).
double sum_of_squares(const torch::Tensor& t);
bool all_finite(const torch::Tensor& t);
void multiply_in_place(const torch::Tensor& t, double factor);
// dst (fp32) += src (any floating dtype), elementwise. src may be on the
// device and dst on the host (offload): src then comes over as a host copy.
void add_into_fp32(const torch::Tensor& dst, const torch::Tensor& src);

}  // namespace shardfit::executor
