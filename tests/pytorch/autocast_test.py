"""pytorch/autocast_emulation.py against PyTorch 1.13's own CPU autocast: the
models written in Python (pytorch/models.py), run on real CPU tensors once
under torch.autocast("cpu", torch.bfloat16) and once under the emulation
(which is what the recorder runs on the meta device, where the real autocast
does nothing), dispatch the same ops with the same dtypes, casts included,
forward and backward; and where the real one raises (bert-tiny's MLM head:
layer_norm of a bf16 input with fp32 weights), so does the emulation."""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "pytorch"))
try:
    import torch  # noqa: E402
except ImportError:
    print("skipped: this python3 (%s) cannot import torch: install Debian's python3-torch "
          "(scripts/install-deps)" % sys.executable)
    sys.exit(77)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
import models  # noqa: E402
from autocast_emulation import AutocastEmulation  # noqa: E402


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
    torch.manual_seed(0)
    model = models.build(name)
    model.train()
    x = torch.randint(0, models.vocab_size(name), (2, 16))
    log = Log()
    with log:
        with region:
            out = model(x)
        loss = out[0] if isinstance(out, tuple) else getattr(out, "loss", out)
        loss.backward()
    return log.ops


class AutocastEmulationTest(unittest.TestCase):
    def test_the_models_dispatch_what_real_cpu_autocast_dispatches(self):
        for name in ("gpt2-tiny", "llama-tiny", "gpt2-hf2022-tiny"):
            with self.subTest(model=name):
                real = dispatched(name, torch.autocast("cpu", dtype=torch.bfloat16))
                emulated = dispatched(name, AutocastEmulation(torch.bfloat16))
                casts = [op for op in real if "_to_copy" in op[0]]
                self.assertGreater(len(casts), 0)  # the comparison is not vacuous
                self.assertEqual(emulated, real)

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


if __name__ == "__main__":
    unittest.main()
