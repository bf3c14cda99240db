// `--attention flash`: causal attention through PyTorch's FlashAttention-2
// kernel, as Hugging Face's sdpa attention calls it
// (torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p,
// is_causal=True), no mask). Eager attention keeps the heads x s x s
// probabilities for backward; the flash kernel keeps the output and one fp32
// log-sum-exp per row, and recomputes the rest in backward.
//
// On the meta device (the planner's trace) the forward and backward allocate
// exactly what PyTorch's kernels allocate, in their order, following
//   aten/src/ATen/native/transformers/cuda/attention.cu
//     (_scaled_dot_product_flash_attention_cuda: q, k, v transposed to
//     [b, s, h, d] views, the output transposed back),
//   aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp
//     (mha_fwd: out = empty_like(q), softmax_lse [b, h, s] fp32, the
//     split-KV accumulators when the occupancy heuristic splits, rng_state
//     and an unused offset, 2 + 1 eight-byte words; mha_bwd: dq, dk, dv =
//     empty_like(q, k, v), softmax_d [b, h, s rounded up to 128] fp32,
//     dq_accum [b, s rounded to 128, h, d rounded to 32 (64 above 128)] fp32),
//   aten/src/ATen/native/transformers/cuda/attention_backward.cu
//     (_flash_attention_backward: grad_out and out made contiguous first),
// as in PyTorch's main branch (FlashAttention 2.6 port, 2025). Autograd
// saves q, k, v, the output, the log-sum-exp and the two rng words
// (derivatives.yaml, _scaled_dot_product_flash_attention).
//
// On a CUDA LibTorch >= 2.0 both call at::scaled_dot_product_attention. This
// CPU build (LibTorch 1.13) has no such kernel: anything but meta tensors is
// refused with std::invalid_argument.
#pragma once

#include <torch/torch.h>

namespace shardfit::models {

// q, k, v: [b, heads, s, d] (k and v with as many heads as q: Hugging Face
// repeats them first). Returns [b, heads, s, d]. `sm_count`: the device's
// streaming multiprocessors (the forward's split-KV heuristic).
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout, int64_t sm_count);

// The memory-efficient kernel (`--attention sdpa` on CUDA in fp32 or below
// compute capability 8.0), as scaled_dot_product_attention(q, k, v,
// dropout_p, is_causal=True) runs it there, following PyTorch 2.11's
//   aten/src/ATen/native/transformers/cuda/attention.cu
//     (_scaled_dot_product_efficient_attention_cuda and
//     _efficient_attention_forward: res [b, s, h, d] in q's dtype,
//     logsumexp [b, h, ceil(s / 32) * 32] fp32; the philox seed and offset
//     are CPU scalars outside CUDA graph capture: no device memory),
//   aten/src/ATen/native/transformers/cuda/attention_backward.cu
//     (_efficient_attention_backward: grad_out made contiguous, grad_q,
//     grad_k, grad_v = empty(q, k, v sizes), delta [b, h, s] fp32, which the
//     kernel computes in fp16/bf16 with head dimension up to 64, else
//     (grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()
//     with every temporary of that expression live at once).
// Autograd saves q, k, v, the output, the log-sum-exp and the seed and
// offset (derivatives.yaml, _scaled_dot_product_efficient_attention). Not
// modelled: the backward kernel's workspace (gradient accumulators in fp32
// when a kernel splits keys or accumulates dQ outside registers), a few
// bytes to a tensor of grad_q's size per layer's backward.
torch::Tensor efficient_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  double dropout);

// The forward kernel's number of key/value splits (flash_api.cpp,
// num_splits_heuristic with 2 x SMs: 128 threads per block); 1 = no split
// buffers. Exposed for tests.
int64_t flash_num_splits(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                         int64_t sm_count);

}  // namespace shardfit::models
