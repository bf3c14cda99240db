"""shardfit from Python: trace a PyTorch model, then plan it.

    import shardfit
    trace = shardfit.trace(MyModel, make_batch, seq_len=512, target="cuda")
    plan = shardfit.plan(trace, device="a100-80gb", gpus=8)
    print(plan["chosen"])

trace() records the model's training step on the meta device (no weights, no
GPU) with pytorch/trace_recorder.py's machinery, in this process; plan() runs
the shardfit CLI installed with this package (`shardfit plan --trace FILE
--json`) and returns its plan. Both were built against this environment's
torch when the package was installed (python/build_backend.py). More:
docs/python.md.
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    from ._version import __version__
except ImportError:  # the source folder, not an installed package
    __version__ = "unknown"

HERE = os.path.dirname(os.path.abspath(__file__))
__all__ = ["trace", "plan", "Trace", "BadInput", "ShardfitError", "binary", "profiles_dir"]


class ShardfitError(Exception):
    """A shardfit command failed. `returncode` is its exit code, `stderr` what
    it printed there (the CLI's exit codes: README.md)."""

    def __init__(self, message, returncode=None, stderr=""):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class BadInput(ShardfitError, ValueError):
    """Bad input, named in one line: an argument of trace() or plan(), or what
    the CLI refused with exit code 2 (its one line is the message)."""


def binary():
    """The shardfit CLI installed with this package."""
    path = os.path.join(HERE, "bin", "shardfit")
    if not os.access(path, os.X_OK):
        raise ShardfitError("%s: no shardfit binary beside this package: install it with `pip install ./python` "
                            "from a shardfit checkout" % path)
    return path


def profiles_dir():
    """The device profiles shipped with the package (the CLI finds them itself:
    ../profiles from its own folder)."""
    return os.path.join(HERE, "profiles")


class Trace(os.PathLike):
    """A shardfit.trace/1 file trace() wrote: `path`, `name`, `seq_len`,
    `target` ("cpu" or "cuda"). A path-like: plan() and open() take it."""

    def __init__(self, path, name, seq_len, target):
        self.path, self.name, self.seq_len, self.target = path, name, seq_len, target

    def __fspath__(self):
        return self.path

    def load(self):
        """The file's JSON."""
        with open(self.path) as f:
            return json.load(f)

    def __repr__(self):
        return "Trace(%r, name=%r, seq_len=%d, target=%r)" % (self.path, self.name, self.seq_len, self.target)


def _where(obj):
    """module:qualname of a function or class, as a trace file names its source."""
    return "%s:%s" % (getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", type(obj).__name__))


def _on_meta(module):
    """A copy of a built module whose parameters and buffers are meta tensors
    of the same shapes (tied parameters stay tied): no weight is copied, and
    the module itself is left as it is."""
    import torch
    memo = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    try:
        return copy.deepcopy(module, memo)
    except Exception as e:  # noqa: BLE001 (whatever the module's attributes raise)
        raise BadInput("model_or_factory %s: cannot be copied to the meta device (%s: %s); pass its class or a "
                       "function that builds it" % (_where(type(module)), type(e).__name__, e)) from None


def _check_trace_args(seq_len, target, param_dtype, make_batch):
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise BadInput("seq_len=%r: the sequence length, a whole number of tokens, at least 1" % (seq_len,))
    if target not in ("cpu", "cuda"):
        raise BadInput("target=%r: 'cpu' (plan for device='cpu') or 'cuda' (any GPU profile); no GPU is needed "
                       "either way" % (target,))
    if param_dtype not in (None, "bf16", "fp16"):
        raise BadInput("param_dtype=%r: 'bf16', 'fp16' or None" % (param_dtype,))
    if param_dtype == "fp16" and target != "cuda":
        raise BadInput("param_dtype='fp16': FSDP's fp16 MixedPrecision with ShardedGradScaler, traced for "
                       "target='cuda' only; on a CPU, 'bf16'")
    if not callable(make_batch):
        raise BadInput("make_batch=%r: a function (batch, seq_len, device) returning the forward's positional "
                       "arguments" % (make_batch,))


def trace(model_or_factory, make_batch, seq_len, out=None, *, name=None, target="cpu", block_class=None,
          fp32_outputs=False, param_dtype=None):
    """Records one training step of a model into a shardfit.trace/1 file.

    model_or_factory: an nn.Module subclass or a function returning the
        module (built with every tensor on the meta device: no weights are
        allocated), or a module already built (a copy of it is put on the
        meta device). Its forward returns the loss (or a tuple, or an object
        with .loss, whose loss it is).
    make_batch(batch, seq_len, device): the forward's positional arguments
        (a tuple, or one tensor) for that batch size, on `device`.
    seq_len: the sequence length planned. out: the file to write (default: a
        new file in the temporary folder). name: the model's name in plans.
    target: "cpu" traces the CPU's kernels (plan with device="cpu"), "cuda"
        CUDA's (any GPU profile); no GPU either way.
    block_class: the transformer block (what wrap=block and +ckpt
        candidates wrap and checkpoint; default: the model's `block_class`
        attribute, if any). fp32_outputs, param_dtype: trace_recorder.py's
        --fp32-outputs and --param-dtype (docs/pytorch-stack.md).

    Returns a Trace (path-like). Bad input raises BadInput with one line.
    The process's meta-device kernels stay the C++ ones the tracer uses
    (trace_recorder.use_the_cpp_meta_kernels)."""
    import torch
    _check_trace_args(seq_len, target, param_dtype, make_batch)
    if isinstance(model_or_factory, torch.nn.Module):
        built = model_or_factory
        factory, source = (lambda: _on_meta(built)), _where(type(built))
        name = name or type(built).__name__
    elif callable(model_or_factory):
        factory, source = model_or_factory, _where(model_or_factory)
        name = name or getattr(model_or_factory, "__name__", "model").strip("<>")
    else:
        raise BadInput("model_or_factory=%r: an nn.Module, its class, or a function returning one"
                       % (model_or_factory,))
    made = out is None  # a file of our own, removed again if no trace goes into it
    if made:
        fd, out = tempfile.mkstemp(prefix="%s-" % re.sub(r"[^\w.-]", "_", name), suffix=".trace.json")
        os.close(fd)
    out = os.path.abspath(os.fspath(out))
    from .pytorch import trace_recorder
    try:
        trace_recorder.record_model(factory, make_batch, seq_len, out, name, source, _where(make_batch),
                                    "model_or_factory " + source, block_class=block_class,
                                    target_cuda=target == "cuda", fp32_outputs=fp32_outputs, param_dtype=param_dtype)
    except BaseException as e:
        if made:
            os.unlink(out)
        if isinstance(e, trace_recorder.BadInput):
            raise BadInput(str(e)) from None
        raise
    return Trace(out, name, seq_len, target)


# plan()'s stack= names: PyTorch's own training step, or shardfit's engine.
_STACKS = {"pytorch": "pytorch", "engine": "shardfit", "shardfit": "shardfit"}


def _option(key, value):
    """A keyword argument as the CLI's option: gpu_mem="16GiB" -> --gpu-mem
    16GiB, all=True -> --all, a list -> comma-separated; False or None: left
    out."""
    flag = "--" + key.replace("_", "-")
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(str(v) for v in value)]
    return [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]


def plan(trace_or_path, device, gpus=None, stack="pytorch", **options):
    """Plans a traced model: `shardfit plan --trace FILE --json`, its plan as
    a dict (shardfit.plan/1, or shardfit.plan-sweep/1 when gpus, nodes or
    gpu_mem lists several values: docs/plan-json.md).

    trace_or_path: a Trace or the path of a shardfit.trace/1 file.
    device: a profile name (profiles/*.json, shipped with the package:
        "a100-80gb", "h100-80gb", "cpu", ...) or the path of a profile JSON.
    gpus: GPUs per node (the CLI's default when None), or a list of them.
    stack: "pytorch" (PyTorch's own DDP, ZeRO and FSDP step, the default) or
        "engine" (shardfit's engine).
    options: any other `shardfit plan` option, by its name with _ for -:
        nodes=2, gpu_mem="16GiB", strategies="zero3,ddp", objective="batch",
        all=True, out="plan.json", ... (`shardfit plan --help`).

    The CLI's warnings and notes go to stderr. Exit code 2 raises BadInput
    with the CLI's one line; any other failure ShardfitError."""
    if stack not in _STACKS:
        raise BadInput("stack=%r: 'pytorch' (PyTorch's own DDP/ZeRO/FSDP step) or 'engine' (shardfit's engine)"
                       % (stack,))
    for key in ("trace", "json", "model"):
        if key in options:
            raise BadInput("%s=: plan() gives --trace and --json itself" % key)
    path = os.fspath(trace_or_path)
    if not os.path.isfile(path):
        raise BadInput("%s: no such trace file (shardfit.trace() writes one)" % path)
    cmd = [binary(), "plan", "--trace", path, "--device", os.fspath(device), "--stack", _STACKS[stack], "--json"]
    cmd += _option("gpus", gpus)
    if "log_level" not in options and "quiet" not in options:
        cmd += ["--log-level", "warn"]
    for key, value in options.items():
        cmd += _option(key, value)
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == 2:
        raise BadInput(lines[-1] if lines else "shardfit plan: bad input (exit 2)", 2, done.stderr)
    if done.returncode != 0:
        raise ShardfitError("shardfit plan exited with %d: %s" % (done.returncode, lines[-1] if lines else "no output"),
                            done.returncode, done.stderr)
    if done.stderr:
        sys.stderr.write(done.stderr)
    return json.loads(done.stdout)
