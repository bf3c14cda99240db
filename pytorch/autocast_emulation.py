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

The lists are 1.13's for the CPU (lower_precision_fp: conv1d/2d/3d, bmm,
mm, baddbmm, addmm, addbmm, linear, matmul; fp32: conv_transpose1d/2d/3d and
the losses), each entry probed on this machine's python3-torch 1.13 under
torch.autocast("cpu", torch.bfloat16) with real tensors: the dispatched
`_to_copy`s before linear (input, weight, bias; the weight's not again on a
second call), before cross_entropy's log_softmax, none before cat,
layer_norm, softmax, gelu, prelu or embedding. pytorch/autocast_test.py
checks every entry, and three models op by op, against the real thing. An
op outside these lists that 1.13's CPU autocast would cast is not emulated.
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


class AutocastEmulation(TorchFunctionMode):
    """with AutocastEmulation(torch.bfloat16): loss = model(x)"""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
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
        if func is F.layer_norm:
            # 1.13's CPU layer_norm takes no mixed dtypes (layer_norm_kernel.cpp
            # checks the weight's against the input's); under autocast a bf16
            # input with fp32 weights raises, so the real job cannot run
            # (a BERT MLM head's LayerNorm(gelu(dense(x)))). Refused the same way.
            x = args[0] if args else kwargs.get("input")
            w = args[2] if len(args) > 2 else kwargs.get("weight")
            if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor) and w.dtype != x.dtype:
                raise RuntimeError("layer_norm under autocast: a %s input with %s weights, which 1.13's CPU "
                                   "layer_norm refuses (expected scalar type %s but found %s)"
                                   % (x.dtype, w.dtype, x.dtype, w.dtype))
        if func in LOWER_PRECISION or func in FP32:
            to, cache = (self.dtype, True) if func in LOWER_PRECISION else (torch.float32, False)
            # Last argument first: autocast's wrapper casts them as the
            # arguments of one C++ call (`redispatch(cached_cast(args)...)`),
            # which GCC evaluates right to left; the order sets the casts'
            # autograd sequence numbers, so the order backward runs them in.
            kwargs = {k: self._cast(v, to, cache) for k, v in reversed(list(kwargs.items()))}
            args = tuple(reversed([self._cast(a, to, cache) for a in reversed(args)]))
        return func(*args, **kwargs)
