#include "models/attention.h"

#include <ATen/record_function.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardfit::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// Each meta kernel runs under a record the tracer counts the kernel's
// matrix products from (planner/trace_recorder.cc, fused_attention_shape):
// q [b, h, s, d], k, v, is_causal (always, here).
std::vector<c10::IValue> products_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return {q, k, v, true};
}

enum class Kernel { kFlash, kEfficient, kCudnn };

// A kernel as its messages name it: the option that chose it, and the kernel.
std::string named(Kernel kernel) {
  switch (kernel) {
    case Kernel::kFlash:
      return "--attention flash: the flash kernel";
    case Kernel::kEfficient:
      return "--attention sdpa: the memory-efficient kernel";
    case Kernel::kCudnn:
      return "--attention sdpa: cuDNN's attention";
  }
  throw std::logic_error("unknown attention kernel");
}

// sdp_utils.cpp (check_flash_attention_datatype, check_dtypes_low_precision):
// the flash kernel and cuDNN's take fp16 and bf16 only; fp32 would fall back
// to another kernel with other memory.
void require_half(Kernel kernel, const torch::Tensor& q) {
  if (q.scalar_type() != torch::kHalf && q.scalar_type() != torch::kBFloat16)
    throw std::invalid_argument(named(kernel) + " takes fp16 or bf16, not fp32");
}

// What the flash kernels allocate, on meta tensors (see attention.h for the
// sources). Forward: out, softmax_lse, [split-KV accumulators, freed on
// return], rng_state, unused offset. Backward: contiguous grad_out and out,
// dq, dk, dv, softmax_d, dq_accum (both freed on return).
class FlashAttentionMeta : public torch::autograd::Function<FlashAttentionMeta> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout, int64_t sm_count) {
    const auto qt = q.transpose(1, 2), kt = k.transpose(1, 2);  // [b, s, h, d]
    const int64_t b = qt.size(0), s = qt.size(1), h = qt.size(2), d = qt.size(3), sk = kt.size(1);
    auto out = at::empty_like(qt);
    auto lse = at::empty({b, h, s}, q.options().dtype(torch::kFloat));
    torch::Tensor lse_accum, out_accum;  // live until mha_fwd returns
    const int64_t splits = dropout == 0 ? flash_num_splits(b, h, s, sk, d, sm_count) : 1;
    if (splits > 1) {
      const int64_t d_rounded = round_up(d, d <= 128 ? 32 : 64);
      lse_accum = at::empty({splits, b, h, s}, q.options().dtype(torch::kFloat));
      out_accum = at::empty({splits, b, h, s, d_rounded}, q.options().dtype(torch::kFloat));
    }
    // rng_state (2 x uint64) and the unused offset (one uint64): kLong has
    // their size and LibTorch 1.13 has no kUInt64. With dropout the state is
    // allocated again (the first freed) for the philox seed and offset.
    auto rng_state = at::empty({2}, q.options().dtype(torch::kLong));
    auto unused = at::empty({}, q.options().dtype(torch::kLong));
    if (dropout > 0) rng_state = at::empty({2}, q.options().dtype(torch::kLong));
    lse_accum = torch::Tensor();
    out_accum = torch::Tensor();
    auto result = out.transpose(1, 2);
    ctx->save_for_backward({q, k, v, result, lse, rng_state, unused});
    return result;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    RECORD_FUNCTION("shardfit::fused_attention_backward", products_of(saved[0], saved[1], saved[2]));
    const auto qt = saved[0].transpose(1, 2), kt = saved[1].transpose(1, 2), vt = saved[2].transpose(1, 2);
    const int64_t b = qt.size(0), s = qt.size(1), h = qt.size(2), d = qt.size(3);
    auto grad_out = grads[0].transpose(1, 2).contiguous();
    auto out = saved[3].transpose(1, 2).contiguous();
    auto dq = at::empty_like(qt);
    auto dk = at::empty_like(kt);
    auto dv = at::empty_like(vt);
    auto f32 = qt.options().dtype(torch::kFloat);
    auto softmax_d = at::empty({b, h, round_up(s, 128)}, f32);
    auto dq_accum = at::empty({b, round_up(s, 128), h, round_up(d, d <= 128 ? 32 : 64)}, f32);
    return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), torch::Tensor(), torch::Tensor()};
  }
};

// What the memory-efficient kernels allocate, on meta tensors (see
// attention.h for the sources).
class EfficientAttentionMeta : public torch::autograd::Function<EfficientAttentionMeta> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
    const auto qt = q.transpose(1, 2);  // [b, s, h, d]
    const int64_t b = qt.size(0), s = qt.size(1), h = qt.size(2);
    auto out = at::empty({b, s, h, v.size(3)}, q.options());
    auto lse = at::empty({b, h, round_up(s, 32)}, q.options().dtype(torch::kFloat));
    auto result = out.transpose(1, 2);
    ctx->save_for_backward({q, k, v, result, lse});
    return result;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    RECORD_FUNCTION("shardfit::fused_attention_backward", products_of(saved[0], saved[1], saved[2]));
    const auto qt = saved[0].transpose(1, 2), kt = saved[1].transpose(1, 2), vt = saved[2].transpose(1, 2);
    const int64_t b = qt.size(0), s = qt.size(1), h = qt.size(2), d = qt.size(3);
    auto grad_out = grads[0].transpose(1, 2).contiguous();
    const auto out = saved[3].transpose(1, 2);
    auto dq = at::empty(qt.sizes(), qt.options());
    auto dk = at::empty(kt.sizes(), kt.options());
    auto dv = at::empty(vt.sizes(), vt.options());
    const bool kernel_computes_delta = qt.scalar_type() != torch::kFloat && d <= 64;
    auto delta = kernel_computes_delta
                     ? at::empty({b, h, s}, qt.options().dtype(torch::kFloat))
                     : (grad_out.to(torch::kFloat) * out.to(torch::kFloat)).sum(-1).transpose(-2, -1).contiguous();
    return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
  }
};

constexpr int64_t kCudnnEngineWorkspace = 256;  // bytes: the H200's recording (models/attention.h)

// ATen/native/transformers/sdp_utils.h permute_to_matching_layout: grad_out copied into
// the output's stride order.
torch::Tensor permute_to_matching_layout(const torch::Tensor& out, const torch::Tensor& grad) {
  std::vector<int64_t> outer_to_inner(out.dim());
  std::iota(outer_to_inner.begin(), outer_to_inner.end(), 0);
  std::stable_sort(outer_to_inner.begin(), outer_to_inner.end(),
                   [&out](int64_t a, int64_t b) { return out.stride(a) > out.stride(b); });
  std::vector<int64_t> inverse(out.dim());
  for (int64_t d = 0; d < out.dim(); ++d) inverse[outer_to_inner[d]] = d;
  return grad.permute(outer_to_inner).contiguous().permute(inverse);
}

// What cuDNN's attention allocates, on meta tensors (see attention.h for the
// sources). Forward: seed, offset, out, [softmax stats], workspace (freed on
// return). Backward: [grad_out in the output's layout], dq, dk, dv,
// workspace (freed on return).
class CudnnAttentionMeta : public torch::autograd::Function<CudnnAttentionMeta> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, bool log_sumexp) {
    const int64_t b = q.size(0), h = q.size(1), s = q.size(2);
    auto seed = at::zeros({1}, q.options().dtype(torch::kLong));
    auto offset = at::zeros({1}, q.options().dtype(torch::kLong));
    auto out = at::empty_like(q);  // alloc_with_matching_layout(q, {b, h, s, d_v}), d_v == d
    torch::Tensor stats;
    if (log_sumexp) stats = at::empty({b, h, s, 1}, q.options().dtype(torch::kFloat));
    at::empty({cudnn_forward_workspace_bytes()}, q.options().dtype(torch::kByte));  // freed as the graph returns
    ctx->save_for_backward({q, k, v, out, stats, seed, offset});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    RECORD_FUNCTION("shardfit::fused_attention_backward", products_of(q, k, v));
    torch::Tensor grad_out = grads[0];
    if (grad_out.stride(-1) != 1) grad_out = permute_to_matching_layout(out, grad_out);
    auto dq = at::empty_like(q);
    auto dk = at::empty_like(k);
    auto dv = at::empty_like(v);
    at::empty({cudnn_backward_workspace_bytes(q.size(0), q.size(1), q.size(2), q.size(3))},
              q.options().dtype(torch::kByte));
    return {dq, dk, dv, torch::Tensor()};
  }
};

// scaled_dot_product_attention's should_compute_logsumexp: an input that
// requires grad, with grad mode on.
bool log_sumexp_needed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

// The kernel on CUDA tensors. From LibTorch 2.11 (the pinned stack, whose
// signatures these are) by its own op, with the arguments
// scaled_dot_product_attention passes it, so the run takes the kernel its
// plan modelled whatever the priority order; before 2.11
// scaled_dot_product_attention's own choice; before 2.0 none (1.13 runs
// eager attention only). shardfit's CPU engine runs eager attention.
torch::Tensor on_cuda(Kernel kernel, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                      double dropout) {
  if (!q.is_cuda())
    throw std::invalid_argument(named(kernel) + " runs on CUDA tensors, not on " + q.device().str() +
                                " (shardfit's CPU engine runs eager attention)");
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  const bool lse = log_sumexp_needed(q, k, v);
  switch (kernel) {
    case Kernel::kFlash:
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, dropout, /*is_causal=*/true));
    case Kernel::kEfficient:
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, lse, dropout, true));
    case Kernel::kCudnn:
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, lse, dropout, true));
  }
  throw std::logic_error("unknown attention kernel");
#elif TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true);
#else
  (void)k, (void)v, (void)dropout;
  throw std::invalid_argument(named(kernel) +
                              " needs a CUDA LibTorch 2.0 or later (this build runs only eager attention)");
#endif
}

}  // namespace

int64_t cudnn_forward_workspace_bytes() { return kCudnnEngineWorkspace; }

int64_t cudnn_backward_workspace_bytes(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  return batch * heads * seq * head_dim * 4 + batch * heads * seq * 4 + kCudnnEngineWorkspace;
}

int64_t flash_num_splits(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                         int64_t sm_count) {
  if (sm_count <= 0) return 1;
  const int64_t block_n = head_dim <= 64 ? 256 : (head_dim <= 128 ? 128 : 64);
  const int64_t n_blocks = ceil_div(seq_k, block_n);
  const int64_t work = batch * heads * ceil_div(seq_q, 64);  // (batch x heads x 64-row blocks)
  const int64_t slots = 2 * sm_count;  // 128 threads per block: two blocks per SM
  if (static_cast<double>(work) >= 0.8 * static_cast<double>(slots)) return 1;
  const int64_t most = std::min({int64_t{128}, slots, n_blocks});
  // A split count is worth trying only if it changes the blocks per split.
  auto eligible = [&](int64_t n) { return n == 1 || ceil_div(n_blocks, n) != ceil_div(n_blocks, n - 1); };
  auto efficiency = [&](int64_t n) {
    const double waves = static_cast<double>(work * n) / static_cast<double>(slots);
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int64_t n = 1; n <= most; ++n)
    if (eligible(n)) best = std::max(best, efficiency(n));
  for (int64_t n = 1; n <= most; ++n)
    if (eligible(n) && efficiency(n) >= 0.85 * best) return n;
  return 1;
}

torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout, int64_t sm_count) {
  require_half(Kernel::kFlash, q);
  if (q.is_meta()) {
    RECORD_FUNCTION("shardfit::fused_attention", products_of(q, k, v));
    return FlashAttentionMeta::apply(q, k, v, dropout, sm_count);
  }
  return on_cuda(Kernel::kFlash, q, k, v, dropout);
}

torch::Tensor efficient_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  double dropout) {
  if (q.is_meta()) {
    RECORD_FUNCTION("shardfit::fused_attention", products_of(q, k, v));
    return EfficientAttentionMeta::apply(q, k, v);
  }
  return on_cuda(Kernel::kEfficient, q, k, v, dropout);
}

torch::Tensor cudnn_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout) {
  // sdp_utils.cpp (check_cudnn_tensor_shapes): equal head dimensions; k and
  // v with q's heads here.
  require_half(Kernel::kCudnn, q);
  if (k.size(1) != q.size(1) || v.size(1) != q.size(1) || k.size(3) != q.size(3) || v.size(3) != q.size(3))
    throw std::invalid_argument(named(Kernel::kCudnn) + " is modelled for k and v shaped as q");
  if (q.is_meta()) {
    const bool log_sumexp = log_sumexp_needed(q, k, v);
    RECORD_FUNCTION("shardfit::fused_attention", products_of(q, k, v));
    return CudnnAttentionMeta::apply(q, k, v, log_sumexp);
  }
  return on_cuda(Kernel::kCudnn, q, k, v, dropout);
}

torch::Tensor fused_attention(const ModelConfig& c, const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout) {
  if (c.flash_attention) return flash_attention(q, k, v, dropout, c.flash_sm_count);
  if (c.cudnn_attention) return cudnn_attention(q, k, v, dropout);
  if (c.efficient_attention) return efficient_attention(q, k, v, dropout);
  throw std::logic_error(c.name + ": fused_attention called for eager attention");
}

}  // namespace shardfit::models
