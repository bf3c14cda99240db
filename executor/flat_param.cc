#include "executor/flat_param.h"

#include <cmath>
#include <optional>
#include <stdexcept>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "executor/meter.h"

namespace shardfit::executor {
namespace {

const auto kF32 = torch::TensorOptions().dtype(torch::kFloat);

// fp32 host memory for offloaded state: pinned when the device is a GPU, so
// the copies to and from it are DMA (and may overlap later work).
torch::TensorOptions host_f32(c10::Device device) { return device.is_cpu() ? kF32 : kF32.pinned_memory(true); }

void check_contiguous(const char* what, const torch::Tensor& t) {
  if (!t.is_contiguous()) throw std::logic_error(std::string(what) + ": tensor must be contiguous");
}

// Frees t's memory now, whoever else still holds the tensor: a gloo work
// object keeps references to the tensors of a finished collective until its
// worker thread lets go, which would move the free to a moment the meter
// cannot predict. Nobody reads the storage again.
void free_now(torch::Tensor& t) {
  if (!t.defined()) return;
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
  t.reset();
}

}  // namespace

FlatParam::FlatParam(std::string name, spec::FlatParamLayout layout, int rank,
                     FlatParamConfig config, const std::vector<torch::Tensor>& params,
                     const ValueSource& values)
    : name_(std::move(name)),
      layout_(std::move(layout)),
      rank_(rank),
      config_(config),
      mixed_(config.compute_dtype != torch::kFloat),
      c_bytes_(static_cast<int64_t>(c10::elementSize(config.compute_dtype))),
      dev_f32_(kF32.device(config.device)),
      dev_compute_(dev_f32_.dtype(config.compute_dtype)),
      host_f32_(host_f32(config.device)),
      params_(params) {
  if (params_.size() != layout_.params().size()) {
    throw std::logic_error("unit " + name_ + ": " + std::to_string(params_.size()) +
                           " parameters for a layout of " + std::to_string(layout_.params().size()));
  }
  torch::NoGradGuard no_grad;
  const int64_t padded = layout_.padded_numel();
  const int64_t s = layout_.shard_numel();
  const auto compute = dev_compute_;

  const ValueSource fill = values ? values : [this](size_t i, int64_t offset, const torch::Tensor& dst) {
    dst.copy_(params_[i].reshape({-1}).narrow(0, offset, dst.numel()));
  };
  // Every parameter's values at its offset of a flat buffer, padding zeroed.
  auto copy_full_into = [&](const torch::Tensor& flat) {
    flat.zero_();
    for (size_t i = 0; i < params_.size(); ++i) {
      const spec::FlatParamEntry& e = layout_.params()[i];
      fill(i, 0, flat.narrow(0, e.offset, e.numel));
    }
  };
  // This rank's slice of that flat buffer, without building the buffer.
  auto copy_shard_into = [&](const torch::Tensor& shard) {
    shard.zero_();
    for (const spec::ShardPiece& p : layout_.pieces(rank_))
      fill(static_cast<size_t>(p.param), p.param_offset, shard.narrow(0, p.shard_offset, p.numel));
  };

  if (config_.sharded_params) {
    // The fp32 master shard: device memory, or host memory under offload.
    {
      std::optional<ScopedUntracked> host;
      if (config_.offload) host.emplace();
      shard_ = torch::empty({s}, config_.offload ? host_f32_ : dev_f32_);
      copy_shard_into(shard_);
    }
    // The gathered buffer's StorageImpl, and the views cut from it, are made
    // while it is sized but holds no bytes (a 0-byte allocation, then its
    // size set: views need a storage that big, and a real placeholder would
    // stay cached in a GPU's caching allocator as reserved memory); then its
    // storage is freed (SHARDED) until the first unshard. Two tensors alias
    // it, each with its own version counter: `gathered_` takes the
    // collectives' writes, and the parameters (set_data keeps a parameter's
    // own counter) are what autograd saves, so refilling the storage never
    // trips autograd's in-place check.
    {
      ScopedUntracked placeholder;
      torch::Tensor buffer = torch::empty({0}, compute);  // carries the device's allocator
      buffer.storage().unsafeGetStorageImpl()->set_nbytes(static_cast<size_t>(padded * c_bytes_));
      gathered_storage_ = buffer.storage();
      gathered_ = torch::empty({0}, compute).set_(gathered_storage_, 0, {padded}, {1});
      point_params_at(torch::empty({0}, compute).set_(gathered_storage_, 0, {padded}, {1}));
    }
    free_storage();
    state_ = ParamState::kSharded;  // initial state: only the shard exists
    return;
  }

  if (config_.offload) {
    // zero1+offload: fp32 master slice on the host; the device keeps only
    // the compute-dtype params forward and backward read.
    {
      ScopedUntracked host;
      host_master_ = torch::empty({s}, host_f32_);
      copy_shard_into(host_master_);
    }
    compute_ = torch::empty({padded}, compute);
    copy_full_into(compute_);
  } else {
    full_ = torch::empty({padded}, dev_f32_);
    copy_full_into(full_);
    if (mixed_) {
      compute_ = torch::empty({padded}, compute);
      compute_.copy_(full_);
    } else {
      compute_ = full_;
    }
  }
  point_params_at(compute_);
  state_ = ParamState::kUnsharded;  // full params are never sharded
}

bool FlatParam::staged_gather() const { return mixed_ || config_.offload; }

void FlatParam::point_params_at(const torch::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const spec::FlatParamEntry& e = layout_.params()[i];
    torch::Tensor view = flat.narrow(0, e.offset, e.numel).view(e.shape);
    if (!params_[i].is_meta()) {
      params_[i].set_data(view);
    } else {
      // A parameter built on the meta device (`run --init`). set_data
      // refuses meta -> cpu/cuda as incompatible tensor types
      // (torch/csrc/autograd/variable.cpp, VariableHooks::set_data's
      // _has_compatible_shallow_copy_type check); what it does after that
      // check, for a leaf without a gradient accumulator yet, is this
      // metadata copy (the same TensorImpl, now a view of the flat buffer).
      if (params_[i].grad().defined() || params_[i].grad_fn())
        throw std::logic_error("unit " + name_ + ": a meta parameter with autograd state");
      params_[i].unsafeGetTensorImpl()->shallow_copy_from(view.getIntrusivePtr());
    }
  }
}

void FlatParam::alloc_storage() {
  c10::StorageImpl* impl = gathered_storage_.unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(layout_.padded_numel() * c_bytes_);
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

void FlatParam::free_storage() {
  c10::StorageImpl* impl = gathered_storage_.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
}

void FlatParam::unshard(Communicator& shard_group) {
  launch_unshard(shard_group);  // a no-op when a prefetch already launched it
  finish_unshard();
}

void FlatParam::launch_unshard(Communicator& shard_group) {
  if (!config_.sharded_params || state_ == ParamState::kUnsharded) return;
  torch::NoGradGuard no_grad;
  // Cast (mixed) or host-to-device copy (offload) into a c*s staging buffer
  // that feeds the all-gather and dies with it.
  if (staged_gather()) {
    staging_ = torch::empty({layout_.shard_numel()}, dev_compute_);
    staging_.copy_(shard_);
  }
  alloc_storage();
  gather_ = shard_group.all_gather_into_async(gathered_, staging_.defined() ? staging_ : shard_);
  state_ = ParamState::kUnsharded;  // SHARDED -> UNSHARDED (once gather_ is done)
}

void FlatParam::finish_unshard() {
  if (!gather_) return;
  gather_->wait();
  gather_.reset();
  free_now(staging_);
}

void FlatParam::reshard() {
  if (!config_.sharded_params || state_ == ParamState::kSharded) return;
  finish_unshard();  // a prefetched gather nobody waited for
  free_storage();
  state_ = ParamState::kSharded;  // UNSHARDED -> SHARDED: the shard was never gone
}

void FlatParam::alloc_unsharded_grad() {
  torch::NoGradGuard no_grad;
  unsharded_grad_ = torch::zeros({layout_.padded_numel()}, dev_compute_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const spec::FlatParamEntry& e = layout_.params()[i];
    params_[i].mutable_grad() = unsharded_grad_.narrow(0, e.offset, e.numel).view(e.shape);
  }
}

void FlatParam::attach_flat_grad(const torch::Tensor& flat_grad) {
  if (flat_grad.numel() != layout_.padded_numel())
    throw std::logic_error("unit " + name_ + ": flat grad of " + std::to_string(flat_grad.numel()) +
                           " elements for " + std::to_string(layout_.padded_numel()));
  flat_grad_ = flat_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const spec::FlatParamEntry& e = layout_.params()[i];
    params_[i].mutable_grad() = flat_grad_.narrow(0, e.offset, e.numel).view(e.shape);
  }
}

void FlatParam::reduce_grad(Communicator& group, Communicator* replicate) {
  launch_reduce_grad(group, replicate);
  finish_reduce_grad();
}

// The launch allocates the reduction's output, as the simulator charges it
// at kReduceScatter / kAllReduce; the rest waits for finish_reduce_grad.
void FlatParam::launch_reduce_grad(Communicator& group, Communicator* replicate) {
  if (pending_) throw std::logic_error("unit " + name_ + ": a gradient reduction is already in flight");
  torch::NoGradGuard no_grad;
  const int64_t s = layout_.shard_numel();
  pending_replicate_ = replicate;
  if (!config_.sharded_params)
    throw std::logic_error("unit " + name_ + ": full params are reduced by bucket, in the engine's flat grad");
  if (!unsharded_grad_.defined()) return;  // no backward reached this unit
  if (!mixed_ && !config_.offload) {
    if (!shard_grad_.defined()) {
      // fp32: the reduce-scatter output is the shard grad itself.
      shard_grad_ = torch::empty({s}, dev_f32_);
      reduce_out_ = shard_grad_;
      reduce_adds_ = false;
    } else {
      // Another micro-batch: reduce into the input's own slot, then add.
      reduce_out_ = unsharded_grad_.narrow(0, rank_ * s, s);
      reduce_adds_ = true;
    }
  } else {
    // mixed: a c*s output, upcast into the fp32 shard grad; offload: the
    // output goes device-to-host (upcast there when mixed).
    reduce_out_ = torch::empty({s}, dev_compute_);
  }
  pending_ = group.reduce_scatter_async(reduce_out_, unsharded_grad_, ReduceOp::kAvg);
}

void FlatParam::finish_reduce_grad() {
  if (!pending_) return;
  torch::NoGradGuard no_grad;
  pending_->wait();
  pending_.reset();
  Communicator* replicate = pending_replicate_;
  pending_replicate_ = nullptr;
  const int64_t s = layout_.shard_numel();
  if (replicate) replicate->all_reduce(reduce_out_, ReduceOp::kAvg);
  if (!mixed_ && !config_.offload) {
    if (reduce_adds_) shard_grad_.add_(reduce_out_);
    reduce_out_ = torch::Tensor();
  } else {
    std::optional<ScopedUntracked> host;
    if (config_.offload) host.emplace();
    if (!shard_grad_.defined()) {
      shard_grad_ = torch::empty({s}, config_.offload ? host_f32_ : dev_f32_);
      shard_grad_.copy_(reduce_out_);
    } else {
      add_into_fp32(shard_grad_, reduce_out_);
    }
    host.reset();
    free_now(reduce_out_);
  }
  for (auto& p : params_) p.mutable_grad().reset();
  free_now(unsharded_grad_);
}

void FlatParam::grads_reduced() {
  if (config_.sharded_params || !config_.offload) return;
  // zero1+offload: this rank's slice goes device-to-host (and up to fp32).
  torch::NoGradGuard no_grad;
  ScopedUntracked host;
  const int64_t s = layout_.shard_numel();
  if (!shard_grad_.defined()) shard_grad_ = torch::empty({s}, host_f32_);
  shard_grad_.copy_(flat_grad_.narrow(0, rank_ * s, s));
}

// free_now, not reset: under hybrid the shard grad was the output of the
// replicas' all-reduce, whose gloo work may still hold it (seen: a rank
// whose worker thread ran late kept 290,948 B through the next forward).
void FlatParam::free_shard_grad() {
  if (config_.sharded_params) free_now(shard_grad_);
}

torch::Tensor FlatParam::optimizer_grad() const {
  if (config_.sharded_params || config_.offload) return shard_grad_;
  if (!flat_grad_.defined()) return {};
  if (config_.shard_optimizer) {
    const int64_t s = layout_.shard_numel();
    return flat_grad_.narrow(0, rank_ * s, s);
  }
  return flat_grad_;
}

torch::Tensor FlatParam::master() const {
  if (config_.sharded_params) return shard_;
  if (config_.offload) return host_master_;
  if (config_.shard_optimizer) {
    const int64_t s = layout_.shard_numel();
    return full_.narrow(0, rank_ * s, s);
  }
  return full_;
}

void FlatParam::optimizer_step(const AdamWOptions& options, int64_t step, Communicator& group) {
  torch::Tensor grad = optimizer_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor p = master();
  {
    std::optional<ScopedUntracked> host;  // offload: the update runs on the host
    if (config_.offload) host.emplace();
    if (!exp_avg_.defined()) ensure_optimizer_state();  // lazily, as torch.optim does
    // ddp/zero1 mixed: the fp32 update reads an fp32 copy of the c-byte grad.
    torch::Tensor g32 = grad;
    if (grad.scalar_type() != torch::kFloat) {
      g32 = torch::empty(p.sizes(), kF32.device(p.device()));
      g32.copy_(grad);
    }
    adamw_update(p, g32, exp_avg_, exp_avg_sq_, step, options);
  }
  publish_master(group);
}

void FlatParam::ensure_optimizer_state() {
  if (exp_avg_.defined()) return;
  std::optional<ScopedUntracked> host;  // offload: the state lives on the host
  if (config_.offload) host.emplace();
  const torch::Tensor p = master();
  exp_avg_ = torch::zeros_like(p);
  exp_avg_sq_ = torch::zeros_like(p);
}

void FlatParam::publish_master(Communicator& group) {
  torch::NoGradGuard no_grad;
  if (config_.sharded_params) return;
  const int64_t s = layout_.shard_numel();
  if (config_.offload) {
    // The updated host slice comes back through a c*s staging copy and is
    // all-gathered into the compute params in place.
    torch::Tensor staging = torch::empty({s}, dev_compute_);
    staging.copy_(host_master_);
    group.all_gather_into(compute_, staging);
    free_now(staging);
    return;
  }
  if (config_.shard_optimizer) group.all_gather_into(full_, full_.narrow(0, rank_ * s, s));
  if (mixed_) compute_.copy_(full_);
}

void adamw_update(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq, int64_t step, const AdamWOptions& o) {
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step)));
  const double step_size = o.lr / bias_correction1;
  torch::Tensor denom = torch::empty_like(exp_avg_sq);  // the one temporary
  // Everything below is in place; what it may still allocate is LibTorch
  // wrapping the Scalar operands into 0-dim CPU tensors.
  ScopedUntracked scalars;
  p.mul_(1.0 - o.lr * o.weight_decay);
  exp_avg.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  at::sqrt_out(denom, exp_avg_sq);
  denom.div_(bias_correction2_sqrt).add_(o.eps);
  p.addcdiv_(exp_avg, denom, -step_size);
}

double sum_of_squares(const torch::Tensor& t) {
  check_contiguous("sum_of_squares", t);
  if (!t.device().is_cpu()) {
    // The 2-norm reduced in fp32 (a half/bf16 input is cast as the kernel
    // reads it), squared on the host in double.
    const double norm = at::linalg_vector_norm(t, 2.0, {}, false, at::kFloat).item<double>();
    return norm * norm;
  }
  double total = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "sum_of_squares", [&] {
    const scalar_t* p = t.data_ptr<scalar_t>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const double x = static_cast<double>(static_cast<float>(p[i]));
      total += x * x;
    }
  });
  return total;
}

bool all_finite(const torch::Tensor& t) {
  check_contiguous("all_finite", t);
  // A NaN or inf anywhere makes the fp32 sum of squares NaN or inf; finite
  // low-precision gradients cannot overflow it (65504^2 x 2^30 < 3.4e38).
  if (!t.device().is_cpu()) return std::isfinite(sum_of_squares(t));
  bool finite = true;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "all_finite", [&] {
    const scalar_t* p = t.data_ptr<scalar_t>();
    for (int64_t i = 0, n = t.numel(); i < n && finite; ++i)
      finite = std::isfinite(static_cast<float>(p[i]));
  });
  return finite;
}

void multiply_in_place(const torch::Tensor& t, double factor) {
  check_contiguous("multiply_in_place", t);
  if (!t.device().is_cpu()) {
    t.mul_(factor);  // the scalar is a kernel argument, not device memory
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "multiply_in_place", [&] {
    scalar_t* p = t.data_ptr<scalar_t>();
    at::parallel_for(0, t.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        p[i] = static_cast<scalar_t>(static_cast<float>(p[i]) * static_cast<float>(factor));
    });
  });
}

void add_into_fp32(const torch::Tensor& dst, const torch::Tensor& src) {
  check_contiguous("add_into_fp32", dst);
  check_contiguous("add_into_fp32", src);
  if (dst.scalar_type() != torch::kFloat || dst.numel() != src.numel())
    throw std::logic_error("add_into_fp32: dst must be fp32 with src's numel");
  if (dst.device() != src.device()) {
    // Offload on a GPU: the device's c-byte output comes to the host first
    // (host memory, as the caller's scope says), then the loop below.
    add_into_fp32(dst, src.to(dst.device()));
    return;
  }
  if (!dst.device().is_cpu()) {
    dst.add_(src);  // CUDA kernels upcast src as they read it: no copy
    return;
  }
  float* d = dst.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "add_into_fp32", [&] {
    const scalar_t* s = src.data_ptr<scalar_t>();
    at::parallel_for(0, dst.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) d[i] += static_cast<float>(s[i]);
    });
  });
}

}  // namespace shardfit::executor
