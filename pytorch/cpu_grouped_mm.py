"""torch._grouped_mm on the meta device as the CPU runs it.

transformers 5.17 runs a mixture-of-experts layer (Mixtral, Qwen-MoE, ...)
by default with its grouped_mm experts kernel (integrations/moe.py
grouped_mm_experts_forward): the tokens' top-k copies sorted by expert, then
one torch.nn.functional.grouped_mm per projection over all of them, the
experts' boundaries given as a tensor of offsets. Every shape follows the
batch (tokens x top-k rows), none the router's values, so the step can be
traced; the router's choice only says which rows each expert multiplies.

PyTorch 2.11 runs _grouped_mm on a CPU tensor with its
CompositeExplicitAutograd kernel (aten/src/ATen/native/GroupedMMUtils.h):
one output made by create_grouped_gemm_output_tensor, then one mm_out per
group into its rows (2d x 3d: the forward and the input's gradient) or into
its matrix (2d x 2d: the weights' gradient, one (in, out) matrix per
expert), reading the offsets on the host. On the meta device that kernel
cannot read the offsets, and torch's Python meta function accepts bf16 only
(CUDA's CUTLASS kernel's rule). The Meta kernel here allocates what the CPU
kernel allocates: the output, its last dimension's stride rounded up to 16
bytes as create_grouped_gemm_output_tensor lays it out for TMA (a padded
row, so its storage is the strided size; GroupedMMUtils.h as read at
pytorch/pytorch 2295ac7). Autograd's formulas are PyTorch's
own (_grouped_mm's backward is two more _grouped_mm calls), so the backward
needs nothing more. PyTorch 2.11's CPU step allocates these to the byte
(tests/pytorch/hf_trace_test.py, Mixtral).

On CUDA, bf16 on sm90 runs a CUTLASS kernel with its own workspace, which
this does not imitate: a CUDA-target trace of these experts is refused
(hf_models.py)."""
import torch

OPS = ("aten::_grouped_mm",)


def _output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """create_grouped_gemm_output_tensor's shape and strides."""
    dtype = out_dtype or mat_a.dtype
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        size = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]]  # one matrix per group: the weights' gradient
    elif mat_a.dim() == 2:
        size = [mat_a.shape[0], mat_b.shape[-1]]  # rows grouped by expert
    elif mat_b.dim() == 2:
        size = [mat_a.shape[1], mat_b.shape[1]]
    else:
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]  # a plain bmm
    align = 16 // dtype.itemsize
    padded = -(-size[-1] // align) * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


def register():
    """The kernel, for as long as the returned Library lives."""
    meta = torch.library.Library("aten", "IMPL", "Meta")
    meta.impl("_grouped_mm", _output)
    return meta
