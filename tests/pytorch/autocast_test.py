"""pytorch/autocast_emulation.py against the running PyTorch's own CPU autocast: the
models written in Python (pytorch/models.py), run on real CPU tensors once
under torch.autocast("cpu", torch.bfloat16) and once under the emulation
(which is what the recorder runs on the meta device, where the real autocast
does nothing), dispatch the same ops with the same dtypes, casts included,
forward and backward; and where the real one raises (1.13: bert-tiny's MLM
head, layer_norm of a bf16 input with fp32 weights), so does the emulation."""
import unittest

import torch_required  # noqa: F401 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
import models  # noqa: E402
import trace_check  # noqa: E402
from autocast_emulation import AutocastEmulation  # noqa: E402

TORCH_1 = torch.__version__.startswith("1.")


class Log(TorchDispatchMode):
    """Every op as dispatched below autocast and autograd: name and dtypes."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dtypes = lambda xs: tuple(str(x.dtype) for x in xs if isinstance(x, torch.Tensor))  # noqa: E731
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((str(func), dtypes(args), dtypes(outs)))
        return out


def dispatched(name, region):
    model = trace_check.fresh_model(name)
    x = torch.randint(0, models.vocab_size(name), (2, 16))
    log = Log()
    with log:
        with region:
            out = model(x)
        trace_check.loss_of(out).backward()
    return log.ops


class AutocastEmulationTest(unittest.TestCase):
    def test_the_models_dispatch_what_real_cpu_autocast_dispatches(self):
        # 2.x's CPU layer_norm takes a bf16 input with fp32 weights: bert-tiny runs.
        names = ("gpt2-tiny", "llama-tiny", "gpt2-hf2022-tiny") + (() if TORCH_1 else ("bert-tiny",))
        for name in names:
            with self.subTest(model=name):
                real = dispatched(name, torch.autocast("cpu", dtype=torch.bfloat16))
                emulated = dispatched(name, AutocastEmulation(torch.bfloat16))
                casts = [op for op in real if "_to_copy" in op[0]]
                self.assertGreater(len(casts), 0)  # the comparison is not vacuous
                self.assertEqual(emulated, real)

    def test_every_listed_op_casts_as_the_real_autocast_does(self):
        # Each entry of the emulation's lists (and prelu, on neither in 1.13),
        # fp32 and bf16 inputs: the same ops dispatched, the same dtypes.
        import torch.nn.functional as F
        w = lambda *s: torch.rand(*s, requires_grad=True)  # noqa: E731 (a leaf: cached casts)
        x3, x4, x5 = torch.rand(2, 4, 8), torch.rand(2, 4, 8, 8), torch.rand(2, 4, 3, 8, 8)
        m, b3 = torch.rand(8, 8), torch.rand(2, 8, 8)
        long2 = torch.zeros(2, dtype=torch.long)
        cases = {
            "linear": lambda t: F.linear(t(m), w(8, 8), w(8)), "matmul": lambda t: torch.matmul(t(m), w(8, 8)),
            "@": lambda t: t(m) @ w(8, 8), "mm": lambda t: torch.mm(t(m), t(m)), "bmm": lambda t: torch.bmm(t(b3), t(b3)),
            "addmm": lambda t: torch.addmm(t(m), t(m), t(m)), "baddbmm": lambda t: torch.baddbmm(t(b3), t(b3), t(b3)),
            "addbmm": lambda t: torch.addbmm(t(m), t(b3), t(b3)), "conv1d": lambda t: F.conv1d(t(x3), w(4, 4, 3)),
            "conv2d": lambda t: F.conv2d(t(x4), w(4, 4, 3, 3)), "conv3d": lambda t: F.conv3d(t(x5), w(4, 4, 3, 3, 3)),
            "conv_transpose1d": lambda t: F.conv_transpose1d(t(x3), t(torch.rand(4, 4, 3))),
            "conv_transpose2d": lambda t: F.conv_transpose2d(t(x4), t(torch.rand(4, 4, 3, 3))),
            "conv_transpose3d": lambda t: F.conv_transpose3d(t(x5), t(torch.rand(4, 4, 3, 3, 3))),
            "prelu": lambda t: F.prelu(t(x3), t(torch.rand(1))),
            "cross_entropy": lambda t: F.cross_entropy(t(m[:2]), long2), "nll_loss": lambda t: F.nll_loss(t(m[:2]), long2),
            "mse_loss": lambda t: F.mse_loss(t(m), t(m)), "l1_loss": lambda t: F.l1_loss(t(m), t(m)),
            "smooth_l1_loss": lambda t: F.smooth_l1_loss(t(m), t(m)),
            "kl_div": lambda t: F.kl_div(t(m), t(m), reduction="batchmean"),
            "binary_cross_entropy": lambda t: F.binary_cross_entropy(t(m).sigmoid(), t(m).sigmoid()),
        }
        if not TORCH_1:  # 2.0 onwards
            cases["scaled_dot_product_attention"] = lambda t: F.scaled_dot_product_attention(t(x4), t(x4), t(x4))
        for name, case in cases.items():
            for dtype in (torch.float32, torch.bfloat16):
                with self.subTest(op=name, input=dtype):
                    def run(region):
                        torch.manual_seed(0)
                        log = Log()
                        with log, region:
                            case(lambda x: x.to(dtype))
                        return log.ops
                    self.assertEqual(run(AutocastEmulation(torch.bfloat16)),
                                     run(torch.autocast("cpu", dtype=torch.bfloat16)))

    @unittest.skipUnless(TORCH_1, "2.x's CPU layer_norm takes bf16 input with fp32 weights: bert-tiny runs "
                         "under autocast, and the model comparison above covers it")
    def test_a_model_real_autocast_cannot_run_is_refused_too(self):
        with self.assertRaises(RuntimeError):
            dispatched("bert-tiny", torch.autocast("cpu", dtype=torch.bfloat16))
        with self.assertRaises(RuntimeError):
            dispatched("bert-tiny", AutocastEmulation(torch.bfloat16))

    def test_a_parameter_is_cast_once_per_region(self):
        lin = torch.nn.Linear(8, 8)
        x = torch.randn(4, 8)
        log = Log()
        with log:
            with AutocastEmulation(torch.bfloat16) as region:
                lin(x)
                lin(x)
                self.assertEqual(len(region.cache), 2)  # weight and bias
        self.assertEqual(sum("_to_copy" in op[0] for op in log.ops), 2 + 2)  # x twice, weight and bias once
        self.assertEqual(len(region.cache), 0)  # dropped as the region ends


class CudaAutocastEmulationTest(unittest.TestCase):
    """AutocastEmulation(torch.float16, "cuda"): the running PyTorch's CUDA
    lists (autocast_mode.cpp; 2.x's read from its autocast_mode.h), on meta tensors as the recorder runs them. There is
    no CUDA here to compare against, so each case asserts the rule the
    source states: which op casts which argument to which dtype, and which
    does not."""

    def run_ops(self, fn):
        log = Log()
        with log, AutocastEmulation(torch.float16, "cuda") as region:
            out = fn()
        return log.ops, out, region

    def meta(self, *shape, dtype=torch.float32, leaf=False):
        return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=leaf)

    def test_cross_entropy_in_1_13_passes_its_input_dtype_to_log_softmax(self):
        # The fact the CUDA emulation of cross_entropy rests on:
        # cross_entropy_loss (composite) calls log_softmax(self, 1,
        # self.scalar_type()), an explicit dtype autocast's fp32_set_opt_dtype
        # keeps. Seen through a Python kernel at AutogradCPU for log_softmax.int.
        import torch.nn.functional as F
        seen = []

        def probe(x, dim, dtype=None):
            seen.append((x.dtype, dim, dtype))
            raise RuntimeError("probed")
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("log_softmax.int", probe, "AutogradCPU")
        try:
            for dtype in (torch.float32, torch.bfloat16):
                with self.assertRaises(RuntimeError):
                    F.cross_entropy(torch.randn(4, 10, dtype=dtype), torch.zeros(4, dtype=torch.long))
        finally:
            del lib
        self.assertEqual(seen, [(torch.float32, 1, torch.float32), (torch.bfloat16, 1, torch.bfloat16)])

    def test_matmuls_run_in_fp16_and_a_parameter_is_cast_once(self):
        import torch.nn.functional as F
        w, b, x = self.meta(8, 8, leaf=True), self.meta(8, leaf=True), self.meta(4, 8)
        ops, out, region = self.run_ops(lambda: (F.linear(x, w, b), torch.addmm(b, x, w), torch.matmul(x, w)))
        self.assertTrue(all(o.dtype == torch.float16 for o in out))
        casts = [op for op in ops if "_to_copy" in op[0]]
        self.assertEqual(len(casts), 2 + 3)  # w and b once each; x at every call
        self.assertEqual(len(region.cache), 0)  # dropped with the region

    def test_softmax_of_fp16_is_one_kernel_to_fp32(self):
        import torch.nn.functional as F
        x = self.meta(2, 4, 8, dtype=torch.float16)
        for fn, kernel in ((lambda: F.softmax(x, dim=-1), "_softmax"), (lambda: x.log_softmax(-1), "_log_softmax"),
                           (lambda: F.softmax(x, dim=-1, dtype=torch.float32), "_softmax")):
            ops, out, _ = self.run_ops(fn)
            self.assertEqual(out.dtype, torch.float32)
            self.assertEqual([op[0] for op in ops], ["aten.%s.default" % kernel])  # no _to_copy first

    def test_the_fp32_list_casts_fp16_arguments_up(self):
        import torch.nn.functional as F
        x = self.meta(4, 8, dtype=torch.float16)
        w, b = self.meta(8, leaf=True), self.meta(8, leaf=True)
        for name, fn in (("pow", lambda: torch.pow(x, 3.0)), ("exp", lambda: x.exp()), ("rsqrt", lambda: x.rsqrt()),
                         ("layer_norm", lambda: F.layer_norm(x, (8,), w, b)), ("mse_loss", lambda: F.mse_loss(x, x))):
            with self.subTest(op=name):
                ops, out, _ = self.run_ops(fn)
                self.assertEqual(out.dtype, torch.float32)
                self.assertEqual(ops[0][0], "aten._to_copy.default")
                self.assertEqual(ops[0][2], ("torch.float32",))

    def test_cross_entropy_takes_log_softmax_in_fp16_then_nll_loss_in_fp32(self):
        import torch.nn.functional as F
        logits, target = self.meta(6, 10, dtype=torch.float16), torch.zeros(6, dtype=torch.long, device="meta")
        ops, loss, _ = self.run_ops(lambda: F.cross_entropy(logits, target))
        self.assertEqual(loss.dtype, torch.float32)
        names = [op[0] for op in ops]
        self.assertEqual(names, ["aten._log_softmax.default", "aten._to_copy.default", "aten.nll_loss_forward.default"])
        self.assertEqual(ops[0][2], ("torch.float16",))

    def test_reductions_get_an_fp32_dtype_and_other_ops_keep_theirs(self):
        x, y = self.meta(4, 8, dtype=torch.float16), self.meta(4, 8)
        _, s, _ = self.run_ops(lambda: x.sum())
        self.assertEqual(s.dtype, torch.float32)
        _, t, _ = self.run_ops(lambda: torch.tanh(x))
        self.assertEqual(t.dtype, torch.float16)  # on no list
        ops, p, _ = self.run_ops(lambda: torch.addcmul(y, x, x))  # promote: to the widest, fp32
        self.assertEqual(p.dtype, torch.float32)
        self.assertEqual(sum("_to_copy" in op[0] for op in ops), 2)

    def test_2022_gpt2_runs_its_matmuls_in_fp16_and_its_softmax_and_loss_in_fp32(self):
        from trace_recorder import on_meta
        with on_meta():
            model = models.build("gpt2-hf2022-tiny")
        model.train()
        x = torch.zeros(2, 16, dtype=torch.long, device="meta")
        ops, out, _ = self.run_ops(lambda: model(x))
        self.assertEqual(out[0].dtype, torch.float32)
        self.assertEqual(out[1].dtype, torch.float16)  # the logits, from lm_head's linear
        for op in ops:
            if op[0] in ("aten.addmm.default", "aten.bmm.default", "aten.mm.default"):
                self.assertEqual(set(op[1]), {"torch.float16"}, op)
            if op[0] == "aten._softmax.default":
                self.assertEqual(op[1:], (("torch.float16",), ("torch.float32",)))
        self.assertEqual(sum(op[0] == "aten._softmax.default" for op in ops), 2)  # one per layer
        self.assertEqual(sum(op[0] == "aten.pow.Tensor_Scalar" and op[2] == ("torch.float32",) for op in ops), 2)

    @unittest.skipIf(TORCH_1, "1.13's wheel-less Debian build ships no autocast_mode.h lists to read")
    def test_every_cuda_list_entry_a_model_can_call_is_emulated(self):
        """2.x's CUDA lists, read from the running PyTorch's own
        torch/include/ATen/autocast_mode.h: each entry registered for
        AutocastCUDA, and each one Python can call by its name is in the
        emulation's matching set; a PyTorch that adds one fails here."""
        import os
        import re
        import autocast_emulation as ae
        header = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
        with open(header) as f:
            text = f.read()

        def entries(macro):
            """{op name: its dispatcher name (with the overload)}."""
            body = re.search(r"#define %s\(_\)(.*?)\n\n" % macro, text, re.S).group(1)
            named = re.findall(r'_\(ADD_NS\((\w+)\),[\s\\]*"([\w.]+)"', body)  # the redispatched ones
            if named:
                return dict(named)
            return {op: op + ("." + overload if overload else "")
                    for op, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body)}

        # Reached only inside another listed op, never by a model's Python.
        inner = {"_convolution", "convolution", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
                 "_scaled_dot_product_flash_attention"}
        names = lambda fns: {getattr(f, "__name__", "") for f in fns}  # noqa: E731
        softmax = names(ae.CUDA_SOFTMAX)
        for macro, emulated in (("AT_FORALL_LOWER_PRECISION_FP", names(ae.CUDA_LOWER_PRECISION)),
                                ("AT_FORALL_FP32", names(ae.CUDA_FP32)),
                                ("AT_FORALL_FP32_SET_OPT_DTYPE", names(ae.CUDA_SET_OPT_DTYPE) | softmax),
                                ("AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE", names(ae.CUDA_SET_OPT_DTYPE)),
                                ("AT_FORALL_PROMOTE", names(ae.CUDA_PROMOTE) | {"grid_sampler"})):
            listed = entries(macro)
            self.assertTrue(listed, macro)
            for op in listed.values():
                self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + op, "AutocastCUDA"), op)
            self.assertEqual(set(listed) - inner - emulated, set(), macro)


if __name__ == "__main__":
    unittest.main()
