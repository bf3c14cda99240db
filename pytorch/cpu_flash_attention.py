"""scaled_dot_product_attention on the meta device as the CPU runs it.

torch.nn.functional.scaled_dot_product_attention is a composite op: it asks
_fused_sdp_choice for a backend by the tensors' device, and the meta device's
answer is always the math kernel (attention.cpp _fused_sdp_choice_meta),
while the CPU's (sdp_utils_cpp.cpp) is its flash kernel whenever the inputs
allow it (no dropout, dense tensors, a unit last stride): causal attention
with an all-ones mask, as transformers' sdpa attention calls it with
attention dropout 0 (Llama, Qwen2, Mistral). The math kernel keeps the
(batch, heads, seq, seq) weights for backward, the flash kernel does not, so
a trace taken with the meta answer is far from the CPU step.

register() puts, for a CPU-target trace:
- an AutogradMeta kernel for scaled_dot_product_attention (the composite
  calls its device's choice stub directly, so the choice cannot be replaced
  below it): the CPU's own _fused_sdp_choice, asked of CPU tensors with the
  inputs' shapes and strides (no values are read); flash goes to the op
  below, through autograd (the real backward node), math to the composite
  itself;
- a Meta kernel for _scaled_dot_product_flash_attention_for_cpu: its output
  (empty_like the query) and logsumexp, then the kernel's per-thread
  scratch, freed as it returns;
- one for its backward: the three zeroed gradients, grad_out made
  contiguous, the per-thread scratch, and one qSplitSize float row per
  parallel chunk (taken one after another, as the meter sees them at these
  sizes).
Sizes from PyTorch's aten/src/ATen/native/cpu/FlashAttentionKernel.cpp
(cpu_flash_attention, cpu_flash_attention_backward and their dispatch:
q split 32/64/256 by sequence, kv split 512) and
aten/src/ATen/native/transformers/attention.cpp
(_scaled_dot_product_flash_attention_cpu and its backward), as read at
pytorch/pytorch 008ec6b; PyTorch 2.11's CPU step allocates them to the byte
(tests/pytorch/hf_trace_test.py). fp16 is refused:
its kernel may pack K and V with oneDNN (cpublas::need_pack), outside this
model; a CPU trace runs fp32 and bf16."""
import torch

KV_SPLIT = 512
# The ops given Meta kernels here (PyTorch's Python meta registrations of
# these two are left out of the recorder's: trace_recorder.use_the_cpp_meta_kernels).
OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
SDPA = torch.ops.aten.scaled_dot_product_attention.default
MATH, FLASH = 0, 1  # sdp::SDPBackend (sdp_utils_cpp.h)


def _q_split(q_len):
    return 256 if q_len >= 768 else 64 if q_len >= 192 else 32


def _chunks(work):
    """at::parallel_for(0, work, 1)'s chunks under OpenMP (ParallelOpenMP.h
    invoke_parallel): min(threads, work) threads, each a divup-sized chunk;
    one thread or one item runs inline as one chunk."""
    threads = torch.get_num_threads()
    if work <= 0:
        return 0
    if threads == 1 or work == 1:
        return 1
    used = min(threads, work)
    size = -(-work // used)
    return -(-work // size)


def _cpu_like(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention's composite (attention.cpp), with the
    CPU's backend choice: its flash kernel, or the composite itself, whose
    meta answer is the math kernel the CPU would take too."""
    choice = torch._fused_sdp_choice(_cpu_like(query), _cpu_like(key), _cpu_like(value), _cpu_like(attn_mask),
                                     dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if choice == FLASH and attn_mask is None:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                          scale=scale)[0]
    if choice != MATH:
        raise NotImplementedError("scaled_dot_product_attention with a mask on the CPU's flash kernel (a sliding "
                                  "window shorter than the sequence, padding) is not traced; eager attention is")
    return SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _refuse_half(dtype):
    if dtype == torch.float16:
        raise NotImplementedError("scaled_dot_product_attention in fp16 on the CPU (its flash kernel may pack K "
                                  "and V with oneDNN, which the trace does not model)")


def _forward(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    _refuse_half(query.dtype)
    batch, heads, q_len, head_dim = query.shape
    accum = torch.float32
    output = torch.empty_like(query)
    logsumexp = torch.empty((batch, q_len, heads), dtype=accum, device=query.device).transpose(1, 2)
    q_split = min(_q_split(q_len), q_len)
    kv_split = min(KV_SPLIT, key.shape[2])
    threads = torch.get_num_threads()
    per_thread = q_split * kv_split + 2 * q_split + q_split * value.shape[-1]
    buf = torch.empty((threads, per_thread), dtype=accum, device=query.device)
    reduced = query.dtype == torch.bfloat16
    buf_reduced = (torch.empty((threads, q_split, kv_split), dtype=query.dtype, device=query.device)
                   if reduced else None)
    del buf_reduced, buf  # the kernel's locals, freed as it returns (last made, first freed)
    return output, logsumexp


def _backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    _refuse_half(query.dtype)
    batch, heads, q_len, _ = query.shape
    accum = torch.float32
    grads = [torch.zeros(t.transpose(1, 2).shape, dtype=t.dtype, device=t.device) for t in (query, key, value)]
    grad_out_contig = grad_out.transpose(1, 2).contiguous()
    q_split = min(_q_split(q_len), q_len)
    kv_split = min(KV_SPLIT, value.shape[2])
    threads = torch.get_num_threads()
    buf = torch.empty((threads, 2 * q_split * kv_split), dtype=accum, device=query.device)
    reduced = query.dtype == torch.bfloat16
    buf_reduced = (torch.empty((threads, 2 * q_split * kv_split), dtype=query.dtype, device=query.device)
                   if reduced else None)
    for _ in range(_chunks(batch * heads)):
        dsum = torch.empty((q_split,), dtype=accum, device=query.device)  # each chunk's row sums
        del dsum
    del buf_reduced, buf, grad_out_contig
    return tuple(g.transpose(1, 2) for g in grads)


def register():
    """The kernels, for as long as the returned Libraries live."""
    meta = torch.library.Library("aten", "IMPL", "Meta")
    meta.impl("_scaled_dot_product_flash_attention_for_cpu", _forward)
    meta.impl("_scaled_dot_product_flash_attention_for_cpu_backward", _backward)
    autograd = torch.library.Library("aten", "IMPL", "AutogradMeta")
    autograd.impl("scaled_dot_product_attention", _sdpa)
    return meta, autograd
