"""scaled_dot_product_attention on the meta device as PyTorch 2.11 runs it on
a Hopper card (sm90: the H100 and H200 profiles), for a CUDA-target trace.

torch.nn.functional.scaled_dot_product_attention asks _fused_sdp_choice for
a backend by the tensors' device; the meta device answers math, which keeps
the (batch, heads, seq, seq) weights for backward. On sm90 with a runtime
cuDNN newer than 9.15 (the CUDA 13 wheel pins 9.19) 2.11 puts cuDNN's fused
attention first (sdp_utils.cpp check_prefer_cudnn_attention and
priority_order: cuDNN, flash, memory-efficient, math), and
can_use_cudnn_attention takes dense fp16 and bf16 inputs, grouped-query
ones too, with dropout. The card recorded that choice: in
reports/gpu/history/20261204T114826Z-row11.json.gz (transformers' Llama,
sdpa, bf16, batch 1, seq 4096, 32 query and 8 key/value heads of 64) every
layer's attention allocates 8 + 8 bytes, its output, its 524,288-byte
log-sum-exp and a 256-byte workspace, and its backward dq, dk and dv at
their own heads' sizes and one 67,633,408-byte workspace: cuDNN's
allocations, below, to the byte. (Flash's would put a 16-byte rng state
after the output, and its backward full-head dk and dv beside dq.)

register() puts, for a CUDA-target trace:
- an AutogradMeta kernel for scaled_dot_product_attention (the composite
  calls its device's choice stub directly, so the choice cannot be replaced
  below it): cuDNN's op through autograd (its real backward node) where
  2.11 takes it; what cuDNN does not take is refused, as the kernel 2.11
  would run there is not imitated: fp32 inputs (the memory-efficient
  kernel), a mask (cuDNN's bias path), a head dimension over 128 or not a
  multiple of 8;
- Meta kernels for _scaled_dot_product_cudnn_attention and its backward,
  allocating what 2.11's CUDA kernels allocate, in their order.

Sizes and order from PyTorch's aten/src/ATen/native/transformers/cuda/
attention.cu (_cudnn_attention_forward: the dropout seed and offset,
at::zeros({1}, kLong) each, before the kernel), attention_backward.cu
(_cudnn_attention_backward: dq, dk, dv as empty_like of q, k, v) and
aten/src/ATen/native/cudnn/MHA.cpp (run_cudnn_SDP_fprop: the output by
alloc_with_matching_layout, the softmax stats (b, h, s_q, 1) fp32 when
asked for, then the graph's workspace; run_cudnn_SDP_bprop: grad_out
copied only when its last stride is not 1, then the workspace); the
backward workspace from cudnn-frontend's CompositeSDPABackwardNode
(get_fe_workspace_size_node: an fp32 dQ accumulator, b*h*s_q*d, and the
fp32 dO.O row sums, b*h*s_q) plus, with fewer key/value heads than query
heads, the full-head dK and dV the reduction onto the shared heads reads
(b*h_q*s_kv*d each, in the inputs' dtype), which cuDNN's engine holds in
the same workspace, plus the engine's own 256 bytes: together the card's
67,633,408. The forward's workspace is that engine's 256 bytes alone. The
256 is measured at one shape, not derived, and taken at every shape; that
the full-head dK and dV are what a grouped-query backward adds is the one
reading of the recording that the frontend's source supports, not yet
checked against a second shape."""
import torch
from torch._meta_registrations import alloc_with_matching_layout

OPS = ("aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward")
CUDNN_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
ENGINE_WORKSPACE = 256  # bytes: the card's recording (module docstring)


class NotImitated(NotImplementedError):
    """scaled_dot_product_attention where 2.11 would run a kernel this
    module does not imitate."""


def refusal(query, key, value, attn_mask):
    """Why cuDNN's attention is not what 2.11 runs for these inputs on sm90,
    or None when it is."""
    if query.dtype not in CUDNN_DTYPES:
        return ("scaled_dot_product_attention in %s on CUDA (2.11 runs the memory-efficient kernel, which the "
                "trace does not imitate; bf16 and fp16 run cuDNN's)" % str(query.dtype).replace("torch.", ""))
    if attn_mask is not None:
        return "scaled_dot_product_attention with a mask on CUDA (cuDNN's bias path is not imitated)"
    dims = {query.shape[-1], key.shape[-1], value.shape[-1]}
    if len(dims) != 1 or max(dims) > MAX_HEAD_DIM or max(dims) % 8:
        return ("scaled_dot_product_attention with head dimensions %s on CUDA (cuDNN's is imitated for equal "
                "ones up to %d, multiples of 8)" % (sorted(dims), MAX_HEAD_DIM))
    return None


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention's composite (attention.cpp) where its
    choice is cuDNN: should_compute_logsumexp, then the op."""
    why = refusal(query, key, value, attn_mask)
    if why:
        raise NotImitated(why)
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise RuntimeError("scaled_dot_product_attention: %d query heads and %d key heads need enable_gqa=True"
                           % (query.shape[1], key.shape[1]))
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_cudnn_attention(query, key, value, None, lse, dropout_p, is_causal,
                                                              False, scale=scale)[0]


def _forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
             return_debug_mask=False, scale=None):
    batch, heads, q_len, _ = query.shape
    seed = torch.zeros((1,), dtype=torch.int64, device=query.device)
    offset = torch.zeros((1,), dtype=torch.int64, device=query.device)
    # sdp_utils.h alloc_with_matching_layout, as 2.11's own meta kernel has it
    out = alloc_with_matching_layout(query, (batch, heads, q_len, value.shape[-1]))
    stats = (torch.empty((batch, heads, q_len, 1), dtype=torch.float32, device=query.device)
             if compute_log_sumexp else None)
    workspace = torch.empty((ENGINE_WORKSPACE,), dtype=torch.uint8, device=query.device)
    del workspace  # the graph's, freed as the kernel returns
    return out, stats, None, None, q_len, key.shape[2], seed, offset, None


def backward_workspace_bytes(query, key, value):
    """cuDNN's backward workspace (module docstring): the fp32 dQ
    accumulator and row sums, the full-head dK and dV under grouped query
    heads, and the engine's own bytes."""
    batch, heads, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    size = batch * heads * q_len * head_dim * 4 + batch * heads * q_len * 4 + ENGINE_WORKSPACE
    if key.shape[1] != heads:
        size += batch * heads * kv_len * (key.shape[-1] + value.shape[-1]) * query.element_size()
    return size


def _backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
              cum_seq_k, max_q, max_k, dropout_p, is_causal, scale=None):
    dq, dk, dv = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
    copy = None
    if grad_out.stride(-1) != 1:  # permute_to_matching_layout(o, dO): grad_out in out's layout
        copy = torch.empty_like(out)
    workspace = torch.empty((backward_workspace_bytes(query, key, value),), dtype=torch.uint8, device=query.device)
    del workspace, copy
    return dq, dk, dv


def register():
    """The kernels, for as long as the returned Libraries live."""
    meta = torch.library.Library("aten", "IMPL", "Meta")
    meta.impl("_scaled_dot_product_cudnn_attention", _forward)
    meta.impl("_scaled_dot_product_cudnn_attention_backward", _backward)
    autograd = torch.library.Library("aten", "IMPL", "AutogradMeta")
    autograd.impl("scaled_dot_product_attention", _sdpa)
    return meta, autograd
