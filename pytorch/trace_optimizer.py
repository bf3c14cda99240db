"""The optimizer steps a trace file records (trace_recorder.py calls
trace_steps after the model's batches): torch.optim.AdamW's three
implementations in the running PyTorch's own code (optim/adam.py in 2.11,
optim/adamw.py in 1.13), over the model's meta parameters.

In the order pytorch/trace_capi.cc's writer expects them:
  1. two steps of the for-loop AdamW (foreach=False) over every parameter,
     each .grad present: the first (AdamW makes its state lazily: step,
     exp_avg, exp_avg_sq per parameter) and a later one;
  2. its zero_grad(set_to_none=True);
  3. two steps of each parameter alone (ZeroRedundancyOptimizer's and FSDP's
     local optimizers hold some parameters or shards: the planner composes
     their steps from these, planner/adamw_steps.h);
  4. two steps of AdamW(foreach=True), the multi-tensor step;
  5. two steps of AdamW(fused=True) where the running PyTorch has it for
     both targets (2.x): its step counts live on the parameters' device and
     one _fused_adamw_ kernel updates every parameter in place.
"""
import contextlib

OPTIMIZER = "torch.optim.AdamW(lr=6e-4, weight_decay=0.01)"


class NotTraced(Exception):
    """An optimizer step the tracer could not record: its one line."""


def make_optimizer(params, **implementation):
    """The optimizer whose steps are traced: torch.optim.AdamW as the user
    builds it (`implementation`: foreach= or fused=; none: the for-loop step
    on CPU tensors, 1.13's and 2.11's default there). Its hyperparameters
    change no byte."""
    import torch
    return torch.optim.AdamW(params, lr=6e-4, weight_decay=0.01, **implementation)


def has_fused():
    """Whether the running PyTorch's AdamW takes fused=True on a CPU and on
    CUDA (2.4 added the CPU kernel; 1.13's is CUDA's only)."""
    import torch
    return not torch.__version__.startswith("1.")


@contextlib.contextmanager
def fused_on_meta():
    """AdamW(fused=True) checks each parameter's device against the devices
    with a fused kernel (optim/optimizer.py _device_dtype_check_for_fused,
    2.11), which the meta device is not. The check allocates nothing; it is
    skipped while the step is traced, so the rest is PyTorch's own code: the
    step counts made on the parameters' device, _foreach_add_ over them and
    _fused_adamw_ (planner/meta_kernels.cc gives both the allocations of the
    target's kernels)."""
    import torch.optim.adam as adam
    check = adam._device_dtype_check_for_fused
    adam._device_dtype_check_for_fused = lambda p, cuda_unsupported=False: None
    try:
        yield
    finally:
        adam._device_dtype_check_for_fused = check


def trace_steps(lib, model, modules_json, target_cuda=False):
    """Records the steps listed in this module's docstring, each .grad
    present (zeros, made outside the recording)."""
    import torch

    def begin():
        if lib.shardfit_trace_begin(modules_json.encode(), 0, 0, b"fp32", b"[]", b"accumulate",
                                    1 if target_cuda else 0, torch.get_num_threads()) != 0:
            raise NotTraced("trace: " + lib.shardfit_trace_error().decode())

    def fresh_grads():
        for p in model.parameters():
            p.grad = torch.zeros_like(p)

    def step(o):
        begin()
        try:
            o.step()
        except (NotImplementedError, RuntimeError) as e:
            lib.shardfit_trace_end()
            raise NotTraced("the optimizer's step cannot be traced on the meta device (%s)"
                            % str(e).split("\n")[0])
        lib.shardfit_trace_end()

    fresh_grads()
    opt = make_optimizer(model.parameters())
    step(opt)
    step(opt)
    # opt.zero_grad(set_to_none=True), as the training loop calls it: the
    # gradients it drops were made outside the recording (not in the trace);
    # what it allocates itself is (the profiler's record_function it runs
    # under holds a few hundred host bytes on a CPU target in 1.13).
    begin()
    opt.zero_grad(set_to_none=True)
    lib.shardfit_trace_end()
    del opt
    fresh_grads()
    for p in model.parameters():
        one = make_optimizer([p])
        step(one)
        step(one)
        del one
    # foreach=True (_multi_tensor_adamw; PyTorch 2.x's default on CUDA):
    # each temporary is made for every parameter at once. Its ops' meta
    # kernels are planner/meta_kernels.cc's.
    fresh_grads()
    multi = make_optimizer(model.parameters(), foreach=True)
    step(multi)
    step(multi)
    del multi
    if has_fused():
        fresh_grads()
        with fused_on_meta():
            fused = make_optimizer(model.parameters(), fused=True)
            step(fused)
            step(fused)
        del fused
