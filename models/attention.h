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
// On CUDA each kernel is called by its own op (at::_scaled_dot_product_
// flash_attention, _efficient_attention, _cudnn_attention), with the
// arguments scaled_dot_product_attention passes it, so that a run takes the
// kernel its plan modelled whatever PyTorch's priority order. A LibTorch
// without CUDA (or 1.13) has none of them: anything but meta tensors is
// refused with std::invalid_argument.
#pragma once

#include <torch/torch.h>

#include "models/model_config.h"

namespace shardfit::models {

// The fused kernel `c` runs (where models::fused_attention(c)) on q, k, v
// [b, heads, s, d], causal, as Hugging Face's sdpa attention calls it;
// `dropout` is the attention dropout (0 outside training).
torch::Tensor fused_attention(const ModelConfig& c, const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout);

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

// cuDNN's fused attention (`--attention sdpa` on compute capability 9.0 and
// 10.0 in fp16 and bf16: PyTorch 2.11 puts it first there), as
// scaled_dot_product_attention(q, k, v, dropout_p, is_causal=True) runs it,
// following PyTorch 2.11's
//   aten/src/ATen/native/transformers/cuda/attention.cu
//     (_cudnn_attention_forward: the dropout seed and offset,
//     at::zeros({1}, kLong) each, before the kernel),
//   aten/src/ATen/native/cudnn/MHA.cpp and transformers/sdp_utils.h
//     (run_cudnn_SDP_fprop: the output by alloc_with_matching_layout, which
//     is empty_like(q) at q's shape; the softmax stats [b, h, s, 1] fp32 when
//     the log-sum-exp is asked for, as it is where an input requires grad;
//     the graph's workspace; run_cudnn_SDP_bprop: grad_out permuted to the
//     output's layout only where its last stride is not 1, then the
//     workspace),
//   aten/src/ATen/native/transformers/cuda/attention_backward.cu
//     (_cudnn_attention_backward: dq, dk, dv = empty_like(q, k, v)),
// and the workspaces of pytorch/cuda_attention.py, which the H200's
// recording of transformers' Llama matched to the byte: forward 256 bytes,
// backward an fp32 dQ accumulator [b, h, s, d], fp32 row sums [b, h, s] and
// 256 bytes (cudnn-frontend's CompositeSDPABackwardNode; k and v have q's
// heads here, so no grouped-head term). Autograd saves q, k, v, the output,
// the log-sum-exp, the seed and the offset (derivatives.yaml,
// _scaled_dot_product_cudnn_attention).
torch::Tensor cudnn_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout);

// cuDNN's attention workspace (bytes) for q of [b, heads, s, d]: the forward
// graph's, and the backward's (above).
int64_t cudnn_forward_workspace_bytes();
int64_t cudnn_backward_workspace_bytes(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim);

// The forward kernel's number of key/value splits (flash_api.cpp,
// num_splits_heuristic with 2 x SMs: 128 threads per block); 1 = no split
// buffers. Exposed for tests.
int64_t flash_num_splits(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                         int64_t sm_count);

}  // namespace shardfit::models
