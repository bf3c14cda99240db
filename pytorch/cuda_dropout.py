"""Dropout as a CUDA tensor runs it, for a CUDA-target trace (trace_recorder.py)."""
import contextlib


@contextlib.contextmanager
def fused():
    """Dropout as a CUDA tensor runs it. at::dropout (ATen/native/Dropout.cpp,
    1.12 and 1.13) takes the fused kernel, native_dropout, only when
    is_fused_kernel_acceptable(input, p): a CUDA (XPU, lazy) tensor, 0 < p < 1,
    numel > 0. A meta tensor is none of those, so on its own the trace would
    follow the CPU path (_dropout_impl: an input-dtype noise tensor, kept by
    the product's backward). Inside, F.dropout and torch.dropout call
    native_dropout where CUDA would: its output and a bool mask, the mask
    what backward keeps (planner/meta_kernels.cc allocates them as CUDA's
    dropout_cuda does)."""
    import torch
    import torch.nn.functional as F

    functional, builtin = F.dropout, torch.dropout

    def fused(input, p, train):
        return train and 0 < p < 1 and input.numel() > 0

    def dropout(input, p=0.5, training=True, inplace=False):
        if not inplace and fused(input, p, training):
            return torch.native_dropout(input, p, True)[0]
        return functional(input, p, training, inplace)

    def dropout_builtin(input, p, train):
        return torch.native_dropout(input, p, True)[0] if fused(input, p, train) else builtin(input, p, train)

    F.dropout, torch.dropout = dropout, dropout_builtin
    try:
        yield
    finally:
        F.dropout, torch.dropout = functional, builtin
