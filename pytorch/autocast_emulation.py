"""torch.autocast for the meta device, where PyTorch's own does not act.

The recorder (trace_recorder.py) runs a model on meta tensors, whose dispatch
keys carry no Autocast key: inside torch.autocast("cpu") they run in fp32.
This mode does, above autograd (a TorchFunctionMode), what 1.13's autocast
does at the dispatcher (aten/src/ATen/autocast_mode.cpp), so the casts are in
the autograd graph and in the trace as they are in a real run:

- an op on the lower-precision list gets its floating tensor arguments cast
  to the autocast dtype (`_to_copy`), except float64 ones and those already
  in it; a leaf fp32 tensor that requires grad (a parameter) is cast once per
  autocast region and cached (autocast's cached_cast), the cache dropped when
  the region ends;
- an op on the fp32 list gets its lower-precision floating arguments cast to
  fp32 (never cached);
- every other op runs in whatever dtypes its arguments have.

The lists are the CPU's of the PyTorch that runs (1.13's below; 2.x's
differ as the comment at PyTorch 2.x's lists says) (1.13's lower_precision_fp: conv1d/2d/3d, bmm,
mm, baddbmm, addmm, addbmm, linear, matmul; fp32: conv_transpose1d/2d/3d and
the losses), each entry probed on this machine's python3-torch 1.13 under
torch.autocast("cpu", torch.bfloat16) with real tensors: the dispatched
`_to_copy`s before linear (input, weight, bias; the weight's not again on a
second call), before cross_entropy's log_softmax, none before cat,
layer_norm, softmax, gelu, prelu or embedding. pytorch/autocast_test.py
checks every entry, and three models op by op, against the real thing. An
op outside these lists that 1.13's CPU autocast would cast is not emulated.

`device="cuda"` (a trace for CUDA's kernels, fp16): the running PyTorch's
CUDA lists instead -- 1.13's (autocast_mode.cpp, `TORCH_LIBRARY_IMPL(aten,
Autocast, m)`) as follows, 2.x's additions below them -- which differ from
the CPU's:
- lower_precision_fp: the matmuls, linear, the convolutions and transposed
  convolutions, einsum, addmv, addr, mv, prelu, chain_matmul, multi_dot;
- fp32 (the lower-precision arguments cast up): pow, exp, log, rsqrt and
  the other unary ops listed, layer_norm, group_norm, softplus, logsumexp,
  cdist/dist/renorm, cosine_similarity and the losses -- but not
  cross_entropy, which CUDA does not list: 1.13's cross_entropy_loss is
  composite and calls `log_softmax(self, 1, self.scalar_type())` (probed on
  this machine's 1.13: tests/pytorch/autocast_test.py), an explicit dtype
  that fp32_set_opt_dtype keeps, so the log-softmax runs in fp16 and
  nll_loss (fp32 list) casts its fp16 result up;
- fp32_set_opt_dtype: softmax, log_softmax, sum, prod, cumsum, cumprod get
  dtype=float32 when none is given; CUDA's softmax/log_softmax of an fp16
  input to fp32 is one kernel (SoftMax.cpp: `_softmax(input, dim,
  half_to_float=true)`: no fp16->fp32 copy), imitated with that call;
- promote: addcmul, addcdiv, atan2, dot, cross, tensordot, bilinear cast
  every floating argument to the widest among them.
None of this can be checked against the real CUDA autocast without a GPU;
its mechanics (which op casts what, once or every call) are tested against
the source's rules in tests/pytorch/autocast_test.py.
"""
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

T = torch.Tensor
LOWER_PRECISION = {
    F.linear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm,
    torch.addmm, T.addmm, torch.baddbmm, T.baddbmm, torch.addbmm, T.addbmm, F.conv1d, F.conv2d, F.conv3d,
}
FP32 = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
        F.cross_entropy, F.nll_loss, F.mse_loss, F.binary_cross_entropy, F.kl_div, F.smooth_l1_loss, F.l1_loss}


# 1.13's CUDA lists (autocast_mode.cpp), as the Python callables that reach them.
CUDA_LOWER_PRECISION = LOWER_PRECISION | {
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.prelu, torch.prelu, torch.einsum,
    torch.addmv, T.addmv, torch.addr, T.addr, torch.mv, T.mv, torch.chain_matmul, torch.linalg.multi_dot,
}
CUDA_FP32 = {
    torch.acos, T.acos, torch.asin, T.asin, torch.cosh, T.cosh, torch.erfinv, T.erfinv, torch.exp, T.exp,
    torch.expm1, T.expm1, torch.log, T.log, torch.log10, T.log10, torch.log2, T.log2, torch.log1p, T.log1p,
    torch.reciprocal, T.reciprocal, torch.rsqrt, T.rsqrt, torch.sinh, T.sinh, torch.tan, T.tan,
    torch.pow, T.pow, T.__pow__, T.__rpow__, F.softplus, F.layer_norm, torch.layer_norm, F.group_norm,
    F.cosine_similarity, torch.cosine_similarity, torch.logsumexp, T.logsumexp, torch.cdist, torch.dist, T.dist,
    torch.renorm, T.renorm, F.pdist, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div,
    F.poisson_nll_loss, F.cosine_embedding_loss, F.hinge_embedding_loss, F.margin_ranking_loss,
    F.multilabel_margin_loss, F.soft_margin_loss, F.triplet_margin_loss, F.multi_margin_loss,
    F.binary_cross_entropy_with_logits,
}
CUDA_SOFTMAX = {F.softmax: False, torch.softmax: False, T.softmax: False,
                F.log_softmax: True, torch.log_softmax: True, T.log_softmax: True}  # value: log
CUDA_SET_OPT_DTYPE = {torch.sum, T.sum, torch.prod, T.prod, torch.cumsum, T.cumsum, torch.cumprod, T.cumprod}
CUDA_PROMOTE = {torch.addcmul, T.addcmul, torch.addcdiv, T.addcdiv, torch.atan2, T.atan2, torch.dot, T.dot,
                torch.cross, T.cross, torch.tensordot, F.bilinear}

# PyTorch 2.x's CPU lists (2.11's autocast_mode.cpp, KERNEL_CPU): the
# transposed convolutions moved from fp32 to lower_precision_fp, and prelu,
# scaled_dot_product_attention, linalg_vecdot and conv_tbc joined it; each
# probed under 2.11's torch.autocast("cpu", torch.bfloat16) with real tensors
# (tests/pytorch/autocast_test.py).
#
# PyTorch 2.x's CUDA lists: the AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
# AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE and
# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE macros of the wheel's own
# torch/include/ATen/autocast_mode.h (2.11.0), which autocast_mode.cpp's
# AutocastCUDA block registers (every entry has an AutocastCUDA kernel in
# 2.11's dispatcher). Beside 1.13's: scaled_dot_product_attention,
# linalg_vecdot, conv_tbc and the RNN cells in lower precision; the
# upsampling ops, native_layer_norm, nll_loss2d and the Frobenius and nuclear
# norms in fp32; the vector and matrix norms (and norm, whose dtype is
# appended) given dtype=float32; vdot, grid_sampler, index_put and
# scatter_add promoted. tests/pytorch/autocast_test.py reads the header and
# fails when a list entry a model can reach from Python is not emulated.
TORCH_1 = torch.__version__.startswith("1.")
if not TORCH_1:
    _TRANSPOSED = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d}
    LOWER_PRECISION = LOWER_PRECISION | _TRANSPOSED | {
        F.prelu, torch.prelu, F.scaled_dot_product_attention, torch.linalg.vecdot, torch.conv_tbc}
    FP32 = FP32 - _TRANSPOSED
    _NN = torch._C._nn
    CUDA_LOWER_PRECISION = CUDA_LOWER_PRECISION | {
        F.scaled_dot_product_attention, torch.linalg.vecdot, torch.conv_tbc, torch.lstm_cell, torch.gru_cell,
        torch.rnn_tanh_cell, torch.rnn_relu_cell}
    CUDA_FP32 = CUDA_FP32 | {
        torch.native_layer_norm, _NN.nll_loss2d, torch.frobenius_norm, torch.nuclear_norm,
        _NN.upsample_nearest1d, _NN._upsample_nearest_exact1d, _NN.upsample_nearest2d,
        _NN._upsample_nearest_exact2d, _NN.upsample_nearest3d, _NN._upsample_nearest_exact3d,
        _NN.upsample_linear1d, _NN.upsample_bilinear2d, _NN._upsample_bilinear2d_aa, _NN.upsample_trilinear3d,
        _NN.upsample_bicubic2d, _NN._upsample_bicubic2d_aa}
    CUDA_SET_OPT_DTYPE = CUDA_SET_OPT_DTYPE | {
        torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.norm, T.norm}
    CUDA_PROMOTE = CUDA_PROMOTE | {torch.vdot, T.vdot, torch.grid_sampler, torch.index_put, T.index_put,
                                   torch.scatter_add, T.scatter_add}


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


class AutocastEmulation(TorchFunctionMode):
    """with AutocastEmulation(torch.bfloat16): loss = model(x)      (the running PyTorch's CPU lists)
    with AutocastEmulation(torch.float16, "cuda"): loss = model(x)  (its CUDA lists)"""

    def __init__(self, dtype, device="cpu"):
        super().__init__()
        if device not in ("cpu", "cuda"):
            raise ValueError("device %r: cpu or cuda" % device)
        self.dtype = dtype
        self.device = device
        self.cache = {}

    def __exit__(self, *exc):
        self.cache.clear()  # autocast's clear_cache() as the outermost region ends
        return super().__exit__(*exc)

    def _cast(self, value, to, cache):
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, to, cache) for v in value)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        if value.dtype in (to, torch.float64):  # is_eligible: float64 is never cast
            return value
        if cache and value.dtype == torch.float32 and value.is_leaf and value.requires_grad and value._base is None:
            key = id(value)
            if key not in self.cache:
                self.cache[key] = (value, value.to(to))  # hold `value` so its id stays its own
            return self.cache[key][1]
        return value.to(to)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.device == "cuda":
            return self._cuda(func, args, kwargs)
        if func is F.layer_norm and TORCH_1:
            # 1.13's CPU layer_norm takes no mixed dtypes (layer_norm_kernel.cpp
            # checks the weight's against the input's); under autocast a bf16
            # input with fp32 weights raises, so the real job cannot run
            # (a BERT MLM head's LayerNorm(gelu(dense(x)))). Refused the same way.
            # 2.x's takes them (mixed-type layer_norm on the CPU).
            x = args[0] if args else kwargs.get("input")
            w = args[2] if len(args) > 2 else kwargs.get("weight")
            if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor) and w.dtype != x.dtype:
                raise RuntimeError("layer_norm under autocast: a %s input with %s weights, which 1.13's CPU "
                                   "layer_norm refuses (expected scalar type %s but found %s)"
                                   % (x.dtype, w.dtype, x.dtype, w.dtype))
        if func in LOWER_PRECISION or func in FP32:
            to, cache = (self.dtype, True) if func in LOWER_PRECISION else (torch.float32, False)
            args, kwargs = self._cast_all(args, kwargs, to, cache)
        return func(*args, **kwargs)

    def _cast_all(self, args, kwargs, to, cache):
        # Last argument first: autocast's wrapper casts them as the
        # arguments of one C++ call (`redispatch(cached_cast(args)...)`),
        # which GCC evaluates right to left; the order sets the casts'
        # autograd sequence numbers, so the order backward runs them in.
        kwargs = {k: self._cast(v, to, cache) for k, v in reversed(list(kwargs.items()))}
        args = tuple(reversed([self._cast(a, to, cache) for a in reversed(args)]))
        return args, kwargs

    def _cuda(self, func, args, kwargs):
        """The running PyTorch's CUDA autocast (see the module's docstring)."""
        if func in CUDA_LOWER_PRECISION or func in CUDA_FP32:
            to, cache = (self.dtype, True) if func in CUDA_LOWER_PRECISION else (torch.float32, False)
            args, kwargs = self._cast_all(args, kwargs, to, cache)
            return func(*args, **kwargs)
        x = _arg(args, kwargs, 0, "input")
        eligible = isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
        if func in CUDA_SOFTMAX:
            dim = _arg(args, kwargs, 1, "dim")
            at = 3 if func in (F.softmax, F.log_softmax) else 2  # F.softmax(input, dim, _stacklevel, dtype)
            dtype = kwargs.get("dtype") or (args[at] if len(args) > at else None)
            if eligible and dtype is None:
                dtype = torch.float32  # fp32_set_opt_dtype
            if dim is None:
                raise RuntimeError("softmax without dim under autocast: not emulated")
            if eligible and x.dtype == torch.float16 and dtype == torch.float32:
                # SoftMax.cpp: a CUDA fp16 input to fp32 is one kernel, no copy.
                return (torch._log_softmax if CUDA_SOFTMAX[func] else torch._softmax)(x, dim, True)
            return (torch.log_softmax if CUDA_SOFTMAX[func] else torch.softmax)(x, dim, dtype=dtype)
        if func in CUDA_SET_OPT_DTYPE:
            if eligible and kwargs.get("dtype") is None:
                kwargs = dict(kwargs, dtype=torch.float32)
            return func(*args, **kwargs)
        if func is F.cross_entropy:
            target = _arg(args, kwargs, 1, "target")
            weight = _arg(args, kwargs, 2, "weight")
            ignore_index = _arg(args, kwargs, 4, "ignore_index", -100)
            reduction = _arg(args, kwargs, 6, "reduction", "mean")
            smoothing = _arg(args, kwargs, 7, "label_smoothing", 0.0)
            legacy = _arg(args, kwargs, 3, "size_average") is not None or _arg(args, kwargs, 5, "reduce") is not None
            if smoothing or legacy or not isinstance(target, torch.Tensor) or target.is_floating_point():
                raise RuntimeError("cross_entropy with label smoothing, probability targets or size_average/reduce "
                                   "under autocast: not emulated")
            # LossNLL.cpp cross_entropy_loss: log_softmax at the input's own
            # dtype (an explicit dtype fp32_set_opt_dtype keeps), then
            # nll_loss, on the fp32 list.
            logp = torch.log_softmax(x, 1 if x.dim() > 1 else 0, dtype=x.dtype)
            args, kwargs = self._cast_all((logp, target), {"weight": weight, "ignore_index": ignore_index,
                                                          "reduction": reduction}, torch.float32, False)
            return F.nll_loss(*args, **kwargs)
        if func in CUDA_PROMOTE:
            floats = [a for a in list(args) + list(kwargs.values())
                      if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if any(a.dtype == torch.float32 for a in floats):
                args, kwargs = self._cast_all(args, kwargs, torch.float32, False)
            return func(*args, **kwargs)
        return func(*args, **kwargs)
