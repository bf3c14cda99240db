#!/usr/bin/env python3
"""Trace a model written in Python into a shardfit.trace/1 file.

    .venv/bin/python pytorch/trace_recorder.py --model mypkg.models:build \\
        --input mypkg.models:make_batch --seq-len 512 --out model.trace.json
    shardfit plan --trace model.trace.json --device a100-80gb ...

--model names a factory (module:function, importable from the current
directory or PYTHONPATH, or a name in pytorch/models.py) that returns an
nn.Module whose forward returns the training loss (or a tuple, or an object
with .loss, whose loss it is: the rest is what the training loop keeps until
its next forward returns, as `outputs = model(**batch)` does). --input names a function
(batch, seq_len, device) returning the forward's positional arguments
(default for the built-ins: token ids). The model is built on the meta
device: no weights, no GPU, no data; GPT-2 XL traces in seconds.

What is recorded is what shardfit's own tracer records for a built-in model,
by the same C++ machinery loaded into this process (libshardfit_torch.so,
pytorch/trace_capi.cc): every storage allocated and freed in one forward,
loss and backward, the op that made it, the innermost module and the phase.
Module boundaries come from this file's hooks: a forward pre-hook and hook
per module, and identity autograd functions on each module's inputs and
output that report where its backward ends and begins (as FSDP's pre- and
post-backward hooks sit). Batches 1, 2 and 3 are traced (the planner takes
batch 1 exactly and extends 2 and 3 affinely), each twice: with every .grad
present (zeros; as the shardfit tracer: the trace holds each backward op's
transient gradient, not the accumulated one) and with none (PyTorch after
zero_grad(set_to_none=True): AccumulateGrad keeps the gradient an op made).
Then the same under torch.autocast, emulated (autocast_emulation.py): bf16
with the running PyTorch's CPU lists for a CPU target; fp16 with its CUDA lists and
torch.cuda.amp.GradScaler's scaled backward for a CUDA one (--fp32-outputs:
the forward's outputs converted to fp32 as Accelerate does). With
--param-dtype bf16, the same again with the model cast to bf16, as FSDP's
MixedPrecision(param_dtype=torch.bfloat16) runs it: its forward computes
with the gathered bf16 flat parameter, buffers cast to buffer_dtype,
floating inputs to param_dtype (for a CUDA target also with every block
checkpointed: FSDP2 bf16 +ckpt). A CUDA target's sdpa runs cuDNN's
attention (cuda_attention.py); a model whose fp32 step would run a CUDA
kernel that is not imitated records no fp32 traces and says why. Then
torch.optim.AdamW's
steps on the meta parameters (trace_optimizer.py): its lazily made state and
the temporaries of its for-loop, multi-tensor and fused implementations,
recorded from PyTorch's own code.

Bad input (a factory that does not import or build, a forward that does not
return a scalar, an op with no meta kernel or a data-dependent shape): one
line naming it on stderr, exit code 2. record_model() is the same recording
for a factory and an input function given as Python objects (the shardfit
package's trace(), python/, calls it; BadInput carries the line).
"""
import argparse
import contextlib
import ctypes
import functools
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if not __package__:
    sys.path.insert(0, HERE)


def sibling(name):
    """One of pytorch/'s modules: by its own name when this file runs from the
    checkout (pytorch/ on sys.path), or from the same package when it is
    installed inside the shardfit package (python/), where no top-level
    `models` is put on the path to shadow a user's own."""
    return importlib.import_module(__package__ + "." + name if __package__ else name)


class BadInput(Exception):
    pass


def use_the_cpp_meta_kernels():
    """PyTorch 2.x registers Python meta functions (torch/_meta_registrations.py)
    over the C++ ones for the Meta key when `torch` is imported: decompositions
    that allocate their own temporaries (prims' intermediates, empty + copy)
    where the CPU and CUDA kernels allocate one output. shardfit's C++ tracer
    runs without Python and so sees the C++ meta kernels, whose outputs are
    the devices' allocations (planner/meta_kernels.cc fills the gaps): the
    Python registrations are dropped here so a trace recorded in Python is the
    same trace, and put back only for the ops that have no C++ meta kernel
    (aten::where.self, for one), as the C++ tracer would find none for them
    either. Idempotent. On 1.13 nothing changes: its traces match the CPU
    step as they are (tests/pytorch/trace_test.py)."""
    global _PYTHON_ONLY_METAS
    import torch
    if torch.__version__.startswith("1."):
        return
    meta = getattr(torch, "_meta_registrations", None)
    lib = getattr(meta, "_meta_lib_dont_use_me_use_register_meta", None)
    if lib is None or getattr(lib, "m", None) is None:
        return
    from torch._decomp import global_decomposition_table
    cpu_flash_attention = sibling("cpu_flash_attention")
    cpu_grouped_mm = sibling("cpu_grouped_mm")
    cpu_index_backward = sibling("cpu_index_backward")
    cuda_attention = sibling("cuda_attention")
    lib._destroy()
    # What torch registered (activate_meta in 2.11's _meta_registrations.py):
    # per op the most specific of the meta, post- and pre-autograd tables.
    table = {}
    for kind in ("meta", "post_autograd", "pre_autograd"):
        for op, fn in global_decomposition_table[kind].items():
            table.setdefault(op, fn)
    # A C++ kernel that serves Meta: its own, or a composite one.
    def served(name):
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        return any(has(name, k) for k in ("Meta", "CompositeExplicitAutograd",
                                          "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd"))
    _PYTHON_ONLY_METAS = torch.library.Library("aten", "IMPL", "Meta")
    for op, fn in table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op.is_view:
            continue
        if served(op.name()) or op.name() in (cpu_flash_attention.OPS + cpu_grouped_mm.OPS + cpu_index_backward.OPS +
                                              cuda_attention.OPS):
            continue
        _PYTHON_ONLY_METAS.impl(op, fn)


_PYTHON_ONLY_METAS = None  # the Library holding them: registrations live as long as it does
_CPU_KERNELS = None  # cpu_flash_attention's, cpu_grouped_mm's and cpu_index_backward's kernels, for a CPU target
_CUDA_KERNELS = None  # cuda_attention's, for a CUDA target


def library():
    lib = sibling("shardfit_meter").load_library()
    use_the_cpp_meta_kernels()
    if not getattr(lib, "_trace_set", False):
        i64, c = ctypes.c_int64, ctypes.c_char_p
        lib.shardfit_trace_error.restype = c
        lib.shardfit_trace_reentrant.argtypes = []
        lib.shardfit_trace_autocast.argtypes = []
        lib.shardfit_trace_forget_autocast.argtypes = []
        lib.shardfit_trace_begin.argtypes = [c, i64, i64, c, c, c, ctypes.c_int, ctypes.c_int]
        lib.shardfit_trace_last_peak.restype = i64
        lib.shardfit_trace_write.argtypes = [c, c, c, c, i64, c, ctypes.c_int, c]
        lib.shardfit_trace_output_tensors.argtypes = [c]
        lib.shardfit_trace_block_input_casts.argtypes = [i64]
        for name in ("forward_begin", "forward_end", "backward_begin", "backward_end", "recompute_begin",
                     "recompute_end", "outputs_dropped"):
            getattr(lib, "shardfit_trace_" + name).argtypes = [ctypes.c_int]
        lib._trace_set = True
    return lib


def resolve(spec, what):
    """A module:function spec (or a name in pytorch/models.py) -> callable."""
    models = sibling("models")
    if ":" not in spec:
        if what == "model" and spec in models.CONFIGS:
            return lambda: models.build(spec)
        if what == "input" and spec in models.CONFIGS:
            return models.token_input(models.vocab_size(spec))
        raise BadInput("--%s %s: not module:function, nor a built-in (%s)"
                       % (what, spec, ", ".join(sorted(models.CONFIGS))))
    mod, fn = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise BadInput("--%s %s: cannot be imported (%s)" % (what, spec, e))


@contextlib.contextmanager
def on_meta():
    """Tensor factories called inside (torch.empty, zeros, ones, arange, ...)
    make meta tensors: a module's __init__ allocates no bytes."""
    import torch
    from torch.overrides import TorchFunctionMode

    factories = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "eye",
                 "tensor", "as_tensor", "empty_strided", "linspace"}

    class Meta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if getattr(func, "__name__", "") in factories:
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    with Meta():
        yield


def module_table(model, block_class=None):
    """shardfit.trace/1's module table: named_modules() order, each module's
    own parameters (a tied parameter once, under its first owner; a later
    module registering it lists it as borrowed, by the owner's name) and
    buffers."""
    entries, index, seen, owner = [], {}, set(), {}
    for path, m in model.named_modules():
        index[id(m)] = len(entries)
        params, borrowed = [], []
        for local, p in m._parameters.items():  # named_parameters() hides a tied one
            if p is None:
                continue
            if id(p) in owner:
                borrowed.append(owner[id(p)])
                continue
            owner[id(p)] = (path + "." if path else "") + local
            params.append({"name": (path + "." if path else "") + local, "shape": list(p.shape),
                           "numel": p.numel()})
        buffers = []
        for local, b in m.named_buffers(recurse=False):
            if b is None or id(b) in seen:
                continue
            seen.add(id(b))
            buffers.append({"name": (path + "." if path else "") + local, "shape": list(b.shape),
                            "dtype": str(b.dtype).replace("torch.", ""), "bytes": b.numel() * b.element_size()})
        is_block = block_class is not None and isinstance(m, block_class)
        entries.append({"path": path, "type": type(m).__name__, "parent": -1, "children": [],
                        "params": params, "is_block": is_block, "borrowed_params": borrowed})
        if buffers:
            entries[-1]["buffers"] = buffers
    for path, m in model.named_modules():
        for child in m.children():
            if id(child) in index and entries[index[id(child)]]["parent"] == -1 and index[id(child)] != 0:
                entries[index[id(child)]]["parent"] = index[id(m)]
                entries[index[id(m)]]["children"].append(index[id(child)])
    return entries, index


def _backward_marker(call):
    import torch

    # Its name is the one planner/trace_recorder.cc (tracer_own_op) leaves out
    # of the step's work: a step without the tracer does not run it.
    class ShardfitModuleBoundary(torch.autograd.Function):
        @staticmethod
        def forward(ctx, idx, *xs):
            ctx.idx = idx
            # An output nobody differentiates (logits returned beside the loss)
            # gets no gradient: not a materialized zero tensor the real step lacks.
            ctx.set_materialize_grads(False)
            return tuple(x.view_as(x) for x in xs)

        @staticmethod
        def backward(ctx, *grads):
            call(ctx.idx)
            return (None,) + grads

    return ShardfitModuleBoundary


def install_hooks(model, index, lib):
    import torch
    end_marker = _backward_marker(lib.shardfit_trace_backward_end)
    begin_marker = _backward_marker(lib.shardfit_trace_backward_begin)

    def wrap(marker, idx, values):
        flat = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]
        if not flat or not torch.is_grad_enabled():
            return values
        out = iter(marker.apply(idx, *flat))
        return tuple(next(out) if isinstance(v, torch.Tensor) and v.requires_grad else v for v in values)

    handles = []
    for m in model.modules():
        idx = index[id(m)]

        def pre(module, args, idx=idx):
            lib.shardfit_trace_forward_begin(idx)
            return wrap(end_marker, idx, args)

        def post(module, args, output, idx=idx):
            if isinstance(output, torch.Tensor):
                output = wrap(begin_marker, idx, (output,))[0]
            elif isinstance(output, tuple):
                output = wrap(begin_marker, idx, output)
            lib.shardfit_trace_forward_end(idx)
            return output

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    return handles


class Checkpointed:
    """While alive, every module in `modules` ({module: index}) runs under
    torch.utils.checkpoint (use_reentrant=False, as pytorch/validate.py --ckpt
    and most users call it, or True: --ckpt-reentrant, 1.13's default), and
    its re-run inside backward is reported to the recorder as recompute. The
    re-run calls the module's forward directly, not through its hooks: the
    markers are in the function checkpoint runs."""

    def __init__(self, lib, modules, reentrant=False):
        from torch.utils.checkpoint import checkpoint
        self.reentrant = reentrant
        self.in_backward = False
        self._saved = []
        for m, idx in modules.items():
            inner = m.forward

            def run(*a, _f=inner, _idx=idx, **kw):
                if not self.in_backward:
                    return _f(*a, **kw)
                lib.shardfit_trace_recompute_begin(_idx)
                out = _f(*a, **kw)
                lib.shardfit_trace_recompute_end(_idx)
                return out

            # Keyword arguments (transformers' blocks take the mask so) bound
            # as transformers' own gradient checkpointing binds them: the
            # reentrant kind takes positional ones only.
            m.forward = lambda *a, _run=run, **kw: checkpoint(functools.partial(_run, **kw), *a,
                                                              use_reentrant=reentrant)
            self._saved.append((m, inner))
        self.indices = sorted(modules.values())

    def restore(self):
        for m, inner in self._saved:
            m.forward = inner


def split_loss(out):
    """The loss in what a forward returned: the tensor itself, the first
    element of a tuple (a Hugging Face model with return_dict=False), or
    .loss (its ModelOutput)."""
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return getattr(out, "loss", out)


def outputs_to_fp32(out):
    """Accelerate's convert_outputs_to_fp32 (utils/operations.py, 2021 on:
    its native-AMP prepare_model wraps the model's forward in it): every
    fp16/bf16 tensor of what the forward returned, nested in tuples, lists
    and dicts, as `.float()`; anything else as it is."""
    import torch
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    if isinstance(out, (tuple, list)):
        return type(out)(outputs_to_fp32(o) for o in out)
    if isinstance(out, dict):
        return type(out)({k: outputs_to_fp32(v) for k, v in out.items()})
    return out


def trace_batch(lib, model, modules_json, input_fn, batch, seq_len, grads="accumulate", target_cuda=False,
                checkpointed=None, autocast=None, fp32_outputs=False, param_dtype=None):
    """Records one forward + loss + backward at `batch` into the library's list.
    grads "accumulate": every .grad exists (zeros) when it starts; "none": none
    does (PyTorch's first step, or after zero_grad(set_to_none=True)).
    `checkpointed`: a Checkpointed in force (its modules are recomputed).
    `autocast` ("bf16"): the forward runs under torch.autocast of that dtype,
    as `with torch.autocast(...): outputs = model(x)` (autocast_emulation.py).
    "fp16" (a CUDA target): under CUDA's autocast lists, and the backward is
    torch.cuda.amp.GradScaler's, `scaler.scale(loss).backward()`: the loss
    times the scale (a 1-element fp32 tensor, grad_scaler.py `outputs *
    self._scale`), that product's backward, then the product dropped.
    `fp32_outputs`: under autocast, the forward's outputs are converted to
    fp32 as it returns (outputs_to_fp32, Accelerate's wrapper).
    `param_dtype` ("bf16" or "fp16"): the model is already cast to it (FSDP's
    MixedPrecision); floating inputs are cast too, as FSDP's root casts them
    (_cast_fp_inputs_to_dtype), and the trace is recorded as that dtype's.
    With fp16 the backward is ShardedGradScaler's (torch/distributed/fsdp/
    sharded_grad_scaler.py scale(): `outputs * self._scale`, then
    `.type(outputs.dtype)`, the fp32 product dropped)."""
    import torch
    AutocastEmulation = sibling("autocast_emulation").AutocastEmulation
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if grads == "accumulate" else None
    # GradScaler's scale exists before the step (made outside the recording:
    # the simulator allocates it and the growth tracker in step 1).
    scale = torch.full((1,), 65536.0, device="meta") if "fp16" in (autocast, param_dtype) else None
    recompute = json.dumps(checkpointed.indices if checkpointed else [])
    rc = lib.shardfit_trace_begin(modules_json.encode(), batch, seq_len, (autocast or param_dtype or "fp32").encode(),
                                  recompute.encode(), grads.encode(), 1 if target_cuda else 0,
                                  torch.get_num_threads())
    if rc != 0:
        raise BadInput("trace: " + lib.shardfit_trace_error().decode())
    if checkpointed and checkpointed.reentrant:
        lib.shardfit_trace_reentrant()
    if autocast and lib.shardfit_trace_autocast() != 0:
        raise BadInput("trace: " + lib.shardfit_trace_error().decode())
    region = (AutocastEmulation({"bf16": torch.bfloat16, "fp16": torch.float16}[autocast],
                                "cuda" if target_cuda else "cpu") if autocast
              else contextlib.nullcontext())
    # CUDA's dropout for the forward and for what a checkpointed unit's
    # backward recomputes.
    kernels = sibling("cuda_dropout").fused() if target_cuda else contextlib.nullcontext()
    try:
        with kernels:
            args = input_fn(batch, seq_len, "meta")
            if not isinstance(args, tuple):
                args = (args,)
            if param_dtype:
                low = _low_dtypes()[param_dtype]
                args = tuple(a.to(low) if isinstance(a, torch.Tensor) and torch.is_floating_point(a) else a
                             for a in args)
            with region:
                out = model(*args)
            if autocast and fp32_outputs:
                out = outputs_to_fp32(out)  # outside the autocast region, as Accelerate's wrapper sits
            # What DDP(static_graph=True) clones in its first iteration: each
            # returned tensor with a grad_fn, flattened as DDP flattens them.
            from torch.utils._pytree import tree_flatten
            returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
            lib.shardfit_trace_output_tensors(json.dumps([t.numel() * t.element_size() for t in returned]).encode())
            del returned
            loss = split_loss(out)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise BadInput("the model's forward must return the loss, a scalar tensor, or a tuple or an object "
                               "with .loss whose loss is one (got %s)"
                               % (type(loss).__name__ if not isinstance(loss, torch.Tensor)
                                  else "shape %s" % list(loss.shape)))
            lib.shardfit_trace_backward_phase()
            if checkpointed:
                checkpointed.in_backward = True
            try:
                if scale is not None:
                    scaled = loss * scale
                    if param_dtype:
                        scaled = scaled.type(loss.dtype)
                    scaled.backward()
                    del scaled
                else:
                    loss.backward()
            finally:
                if checkpointed:
                    checkpointed.in_backward = False
            # What the forward returned (the loss too), dropped here, is what a
            # loop holding it (`outputs = model(...)`) keeps until its next
            # forward returns.
            lib.shardfit_trace_outputs_dropped(1)
            del out, loss
            lib.shardfit_trace_outputs_dropped(0)
            del args
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 (whatever the user's forward raises on meta tensors)
        raise BadInput("the model cannot be traced on the meta device (%s)" % str(e).split("\n")[0])
    finally:
        lib.shardfit_trace_end()  # also after a bad forward: the recorder is released


def block_inputs_cast(blocks, dtype):
    """FSDP2's MixedPrecisionPolicy(cast_forward_inputs=True, its default)
    as fully_shard on each block applies it: the block's pre-forward casts
    every floating tensor among its arguments to param_dtype
    (_fsdp_state.py _pre_forward, 2.11), before the block runs; e.g. the
    rotary tables a model computes in fp32 once and passes to every block.
    Forward pre-hooks put ahead of the recorder's own, so the casts are
    recorded before the block begins. Returns their handles, each with
    `converted`: a one-element list counting the tensors converted."""
    import torch
    converted = [0]

    def cast(x):
        if isinstance(x, torch.Tensor) and torch.is_floating_point(x) and x.dtype != dtype:
            converted[0] += 1
            return x.to(dtype)
        return x

    def hook(_module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
    handles = [m.register_forward_pre_hook(hook, prepend=True, with_kwargs=True) for m in blocks]
    for h in handles:
        h.converted = converted
    return handles


# FSDP's MixedPrecision(param_dtype=...) names (--param-dtype).
def _low_dtypes():
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}


def prepare(target_cuda=False):
    """The library loaded and the process's meta kernels made the C++ tracer's
    (use_the_cpp_meta_kernels); then what the target runs where the meta
    device would not. For a CPU target: scaled_dot_product_attention takes
    the CPU's flash kernel, not the meta device's math one; _grouped_mm
    (mixture-of-experts layers) allocates what its CPU kernel allocates;
    indexing's backward scatters in place. For a CUDA target:
    scaled_dot_product_attention takes cuDNN's attention, as 2.11 does on a
    Hopper card (cuda_attention.py). The other target's kernels, registered
    by an earlier recording in this process, are dropped first."""
    global _CPU_KERNELS, _CUDA_KERNELS
    lib = library()
    drop = _CPU_KERNELS if target_cuda else _CUDA_KERNELS
    for registered in drop or ():
        registered._destroy()
    if target_cuda:
        _CPU_KERNELS = None
        _CUDA_KERNELS = _CUDA_KERNELS or sibling("cuda_attention").register()
    else:
        _CUDA_KERNELS = None
        _CPU_KERNELS = _CPU_KERNELS or (sibling("cpu_flash_attention").register() +
                                        (sibling("cpu_grouped_mm").register(), sibling("cpu_index_backward").register()))
    return lib


def resolve_model(model_spec, input_spec, config=None, target_cuda=False, attention=None):
    """The command line's --model, --input, --config and --attention ->
    (factory, input_fn, the architecture's name for an hf: model, else None)."""
    if model_spec.startswith("hf:"):
        # transformers' own class from a config (hf_models.py): its inputs too.
        hf_models = sibling("hf_models")
        if not config:
            raise BadInput("--model %s: needs --config (a config.json or a model directory)" % model_spec)
        try:
            factory, input_fn, arch = hf_models.factory(model_spec[3:], config, target_cuda, attention)
        except hf_models.BadConfig as e:
            raise BadInput(str(e))
        if input_spec:
            input_fn = resolve(input_spec, "input")
        return factory, input_fn, arch
    if config or attention:
        raise BadInput("--%s: for --model hf:<Architecture>" % ("config" if config else "attention"))
    factory = resolve(model_spec, "model")
    if not input_spec and model_spec not in sibling("models").CONFIGS:
        raise BadInput("--input: needed with --model %s (module:function(batch, seq_len, device) returning the "
                       "forward's arguments)" % model_spec)
    return factory, resolve(input_spec or model_spec, "input"), None


def record(model_spec, input_spec, seq_len, out, name=None, block_class=None, batches=(1, 2, 3), target_cuda=False,
           fp32_outputs=False, param_dtype=None, config=None, attention=None):
    """The command line's recording: --model and --input resolved, then
    record_model."""
    prepare(target_cuda)
    factory, input_fn, arch = resolve_model(model_spec, input_spec, config, target_cuda, attention)
    record_model(factory, input_fn, seq_len, out, name or arch or model_spec, model_spec, input_spec or model_spec,
                 "--model " + model_spec, block_class=block_class, batches=batches, target_cuda=target_cuda,
                 fp32_outputs=fp32_outputs, param_dtype=param_dtype)


def record_model(factory, input_fn, seq_len, out, name, factory_name, input_name, label, block_class=None,
                 batches=(1, 2, 3), target_cuda=False, fp32_outputs=False, param_dtype=None):
    """Records a model into the shardfit.trace/1 file `out`. `factory`: () ->
    the nn.Module, called with every tensor factory on the meta device;
    `input_fn`: (batch, seq_len, device) -> the forward's positional
    arguments. The file names the model `name`, and `factory_name` and
    `input_name` as where it and its inputs came from; `label` names the
    model in a bad-input line (the command line's `--model SPEC`)."""
    import torch
    lib = prepare(target_cuda)
    try:
        with on_meta():
            model = factory()
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 (whatever the user's factory raises)
        raise BadInput("%s: does not build (%s: %s)" % (label, type(e).__name__, e))
    if not isinstance(model, torch.nn.Module):
        raise BadInput("%s: returned %s, not an nn.Module" % (label, type(model).__name__))
    model.train()
    block = block_class or getattr(model, "block_class", None)
    table, index = module_table(model, block)
    modules_json = json.dumps(table)
    handles = install_hooks(model, index, lib)

    def trace_batches(**kind):
        """Batches 1, 2 and 3 (`batches`) with every .grad present
        ("accumulate": shardfit's engine, flat gradient views; PyTorch when
        zero_grad keeps the grads) and with none ("none": PyTorch's first step
        and zero_grad(set_to_none=True), plan --stack pytorch); `kind`:
        trace_batch's checkpointed, autocast, fp32_outputs or param_dtype."""
        for grads in ("accumulate", "none"):
            for b in batches:
                trace_batch(lib, model, modules_json, input_fn, b, seq_len, grads, target_cuda, **kind)
    # The same with every block under torch.utils.checkpoint (the +ckpt
    # candidates; blocks are what a plan recomputes without wrap units).
    blocks = {m: index[id(m)] for m in model.modules() if block is not None and isinstance(m, block)}

    def checkpointed_batches(**kind):
        """trace_batches under both kinds of torch.utils.checkpoint:
        use_reentrant False, then True."""
        for reentrant in ((False, True) if blocks else ()):
            ckpt = Checkpointed(lib, blocks, reentrant)
            use_cache = getattr(model, "use_cache", None)
            if use_cache is not None:
                model.use_cache = False  # as Hugging Face's models do under gradient checkpointing
            try:
                trace_batches(checkpointed=ckpt, **kind)
            finally:
                ckpt.restore()
                if use_cache is not None:
                    model.use_cache = use_cache
    # A model whose fp32 step runs a kernel the target's imitation lacks
    # (hf_models.py: sdpa on CUDA) says why; its plans have no fp32
    # candidates.
    untraced = getattr(model, "fp32_not_traced", None)
    try:
        if untraced:
            print("trace_recorder.py: no fp32 traces: %s" % untraced, file=sys.stderr)
        else:
            trace_batches()
            checkpointed_batches()
        # The forward under torch.autocast: bf16 on the CPU (1.13's CPU
        # autocast), fp16 with GradScaler on CUDA (1.13's CUDA autocast,
        # emulated: autocast_emulation.py).
        # A model that cannot run under it (PyTorch raises) gets none: its
        # plans have no bf16 / fp16 candidates.
        precision = "fp16" if target_cuda else "bf16"
        try:
            trace_batches(autocast=precision, fp32_outputs=fp32_outputs)
        except BadInput as e:
            lib.shardfit_trace_forget_autocast()
            print("trace_recorder.py: no traces under torch.autocast(%s): %s" % (precision, e), file=sys.stderr)
        # The model cast to param_dtype, as FSDP's MixedPrecision computes
        # (parameters and floating buffers; the gradients follow), then back.
        # On a CPU target with FSDP2's casts: fully_shard on each block casts
        # the block's floating inputs too (block_inputs_cast). The file says
        # how many it converted: none, and the traces are FSDP1's as well,
        # whose MixedPrecision casts the root's inputs only.
        # A CUDA target's cast model also runs with every block checkpointed:
        # FSDP's MixedPrecision with activation checkpointing (+ckpt bf16).
        if param_dtype:
            model.to(_low_dtypes()[param_dtype])
            casts = [] if target_cuda else block_inputs_cast(blocks, _low_dtypes()[param_dtype])
            try:
                trace_batches(param_dtype=param_dtype)
                if target_cuda:
                    checkpointed_batches(param_dtype=param_dtype)
                else:
                    lib.shardfit_trace_block_input_casts(casts[0].converted[0] if casts else 0)
            finally:
                for h in casts:
                    h.remove()
                model.to(torch.float32)
    finally:
        for h in handles:
            h.remove()
    optimizer = sibling("trace_optimizer")
    try:
        optimizer.trace_steps(lib, model, modules_json, target_cuda)
    except optimizer.NotTraced as e:
        raise BadInput(str(e))
    if lib.shardfit_trace_write(out.encode(), name.encode(), factory_name.encode(), input_name.encode(), seq_len,
                                modules_json.encode(), 1 if target_cuda else 0, optimizer.OPTIMIZER.encode()) != 0:
        raise BadInput("--out %s: %s" % (out, lib.shardfit_trace_error().decode()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="module:function returning the nn.Module, a built-in name, or "
                                                  "hf:<ArchitectureName> (transformers' own class, with --config)")
    p.add_argument("--config", help="--model hf:...: a transformers config.json or a model directory holding one "
                                    "(no weights are read)")
    p.add_argument("--attention", choices=["eager", "sdpa"],
                   help="--model hf:...: the attention where the config names no attn_implementation (default "
                        "eager; transformers itself runs sdpa there)")
    p.add_argument("--input", help="module:function(batch, seq_len, device) -> forward's arguments")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--name", help="the model's name in plans (default: --model)")
    p.add_argument("--out", required=True)
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu",
                   help="whose kernels the trace imitates: the CPU's (plan --device cpu) or CUDA's (a GPU profile); "
                        "no GPU is needed either way")
    p.add_argument("--fp32-outputs", action="store_true",
                   help="under autocast, convert the forward's fp16/bf16 outputs to fp32 as it returns, as Hugging "
                        "Face Accelerate's mixed precision does (convert_outputs_to_fp32)")
    p.add_argument("--param-dtype", choices=["bf16", "fp16"],
                   help="also trace the model cast to this dtype, as PyTorch FSDP's MixedPrecision(param_dtype=..., "
                        "reduce_dtype=..., buffer_dtype=...) and FSDP2's MixedPrecisionPolicy(param_dtype=...) run "
                        "it (plan's zero2/zero3 bf16 or fp16 candidates, fp16 with ShardedGradScaler; fp16 with "
                        "--target cuda only)")
    p.add_argument("--threads", type=int,
                   help="--target cpu: the intra-op threads of each rank the trace stands for (oneDNN's bf16 "
                        "matmuls book scratchpads per thread; `shardfit run` and scripts/pytorch-validate give "
                        "each of N ranks the host's cores / N); default: this process's torch.get_num_threads()")
    a = p.parse_args()
    try:
        if a.seq_len < 1:
            raise BadInput("--seq-len %d: must be at least 1" % a.seq_len)
        if a.threads is not None:
            if a.threads < 1:
                raise BadInput("--threads %d: must be at least 1" % a.threads)
            import torch
            torch.set_num_threads(a.threads)
        if a.param_dtype == "fp16" and a.target != "cuda":
            raise BadInput("--param-dtype fp16: FSDP's fp16 MixedPrecision with ShardedGradScaler, traced for CUDA "
                           "only (--target cuda); on a CPU, --param-dtype bf16")
        record(a.model, a.input, a.seq_len, a.out, a.name, target_cuda=a.target == "cuda",
               fp32_outputs=a.fp32_outputs, param_dtype=a.param_dtype, config=a.config, attention=a.attention)
    except BadInput as e:
        print("trace_recorder: %s" % e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
