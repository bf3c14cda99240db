"""Real PyTorch training jobs measured by shardfit's meter.

Runs a model from pytorch/models.py (or transformers' own class from a
config, --model hf:<Architecture> --config, built as pytorch/hf_models.py
builds it for the recorder) under PyTorch's own data parallelism on
N Gloo ranks of this host (one process per rank, as torchrun would start
them: launch() below) and measures every rank's CPU bytes with
shardfit's meter (pytorch/shardfit_meter.py: the engine's tracking
allocator installed inside the PyTorch process), counted from before the
model is built, as `shardfit run` counts its own ranks.

    --wrap ddp     torch.nn.parallel.DistributedDataParallel (defaults)
    --wrap ddp-bv  the same with gradient_as_bucket_view=True
    --wrap zero1   DDP + torch.distributed.optim.ZeroRedundancyOptimizer
    --wrap fsdp2-zero3  FSDP2: fully_shard on every block (the model's
                   block_class), then on the root, reshard_after_forward=True
    --wrap fsdp2-zero2  the same with reshard_after_forward=False
    --fsdp-prefetch N  FSDP2 with explicit prefetching: N - 1 blocks ahead
                   in the forward, N back in the backward (plan --prefetch N)
    --fsdp-mesh RxS  FSDP2 on a 2-D mesh (HSDP), mesh_dim_names ("replicate",
                   "shard")
    --fsdp-offload pinned|unpinned  FSDP2 with CPUOffloadPolicy(pin_memory=
                   True, its default, or False): 2.11 pins only with a CUDA
                   driver (a CPU-only host: "Found no NVIDIA driver")
    --fsdp-bf16    FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                   reduce_dtype=torch.float32), FSDP1 with MixedPrecision(
                   the same, buffer_dtype=torch.bfloat16) (plan's bf16
                   candidates with --fsdp-reduce-dtype fp32, from a trace
                   recorded with --param-dtype bf16 --threads of a rank);
                   --fsdp-reduce-dtype bf16: reduce_dtype=torch.bfloat16
                   (plan --fsdp-reduce-dtype param)
    --wrap fsdp1-zero3  FSDP1: FullyShardedDataParallel(device_id=cpu), every
                   block a unit (ModuleWrapPolicy), FULL_SHARD
    --wrap fsdp1-zero2  the same with SHARD_GRAD_OP
    --wrap fsdp1-noshard  the same with NO_SHARD (each unit's flat parameter
                   whole on every rank, its gradient all-reduced)
    --fsdp-min-params N  fsdp1-*: size_based_auto_wrap_policy(min_num_params=N)
                   instead of a unit per block (the plan's wrap=size:N)
    --fsdp-use-orig-params  fsdp1-*: FSDP(use_orig_params=True): the
                   optimizer over each parameter's part of the rank's shard
    --log-allocations PREFIX  every allocation and free of each rank, with
                   the Python frames that made it, to PREFIX.rankN.json
    --ckpt         every block under torch.utils.checkpoint (non-reentrant)
    --ckpt-reentrant  the same with use_reentrant=True (1.13's default)
    --hf-gradient-checkpointing  transformers' own model.gradient_checkpointing_enable()
                   (hf:<Architecture> only): each decoder layer a
                   GradientCheckpointingLayer under non-reentrant checkpoint
    --bf16         forward under torch.autocast("cpu", torch.bfloat16)
    --grad-accum N N micro-batches per optimizer step, all but the last under
                   DDP.no_sync() (the gradients summed)

Each step is the loop a PyTorch user writes (and the one `plan --stack
pytorch` simulates): opt.zero_grad(set_to_none=True); x = a batch of token
ids; outputs = model(x) (the loss, or a tuple whose first is the loss: the
rest held until the next forward returns); loss.backward(); del loss, x;
opt.step(). The
optimizer is torch.optim.AdamW (lr 6e-4, weight decay 0.01: shardfit's
defaults; 1.13's for-loop implementation on the CPU). Prints one JSON
object: the job and, per rank, "peak_allocated_bytes", the timeline
(points "init", "stepK/forward", "stepK/backward", "stepK/optimizer") and
each step's wall time ("step_times_s"). With --unmetered the job runs
without the meter, as in a user's process, for its step times alone (its
peak is 0 and its timeline empty).
"""
import argparse
import contextlib
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_threads(nproc):
    """The intra-op threads each of `nproc` ranks on this host runs with (the
    cores / the ranks, at least 1, as `shardfit run` gives them): what a CPU
    trace of the job stands for (trace_recorder.py --threads)."""
    return max(1, (os.cpu_count() or 1) // nproc)


class Settled:
    """`collective`, whose synchronous calls (no async_op: FSDP's and DDP's on
    a CPU) return only once the process group's worker thread has let go of
    what the call made or was given: Gloo's worker may drop a finished work
    object, and what it holds, after wait() has returned, and a free that
    follows is then the worker's, at its timing (docs/pytorch-validation.md,
    "Late frees"). `hold`, called with the call's arguments before it runs,
    returns release(timeout_s), which waits for that and returns (whether it
    was still held when the call returned, whether it still is after
    `timeout_s`). `waited` counts the calls that had to wait, `unsettled`
    those that gave up. async_op calls are passed through: their wait() is
    the caller's. Allocates nothing."""

    def __init__(self, collective, hold, timeout_s=10.0):
        self.collective, self.hold, self.timeout_s = collective, hold, timeout_s
        self.waited = self.unsettled = 0

    def __call__(self, *args, async_op=False, **kwargs):
        if async_op:
            return self.collective(*args, async_op=True, **kwargs)
        release = self.hold(*args, **kwargs)
        try:
            return self.collective(*args, **kwargs)
        finally:
            waited, unsettled = release(self.timeout_s)
            self.waited += waited
            self.unsettled += unsettled


def made_during(meter):
    """Settled's hold for a collective that copies what it is given (Gloo's
    reduce_scatter_tensor all-reduces a clone of its input;
    _broadcast_coalesced flattens its tensors into buckets): the storages
    allocated on the calling thread during the call, until they are freed
    (the meter's watch)."""
    return lambda *args, **kwargs: meter.watch()


def views_of_arguments(torch):
    """Settled's hold for `collective(output_tensor, input_tensor, ...)` whose
    work object keeps views of both (Gloo's all_gather_into_tensor): their
    storages, until nothing but the caller holds them again (their
    torch._C._storage_Use_Count back to its value before the call)."""
    use_count = torch._C._storage_Use_Count

    def hold(output_tensor, input_tensor, *args, **kwargs):
        storages = [output_tensor.untyped_storage(), input_tensor.untyped_storage()]
        before = [use_count(s._cdata) for s in storages]

        def held():
            return any(use_count(s._cdata) > b for s, b in zip(storages, before))

        def release(timeout_s):
            was_held, deadline = held(), time.monotonic() + timeout_s
            while held():
                if time.monotonic() > deadline:
                    return was_held, True
                time.sleep(0.0001)
            return was_held, False
        return release
    return hold


class Unmetered:
    """--unmetered's stand-in for the meter: the job's marks cost nothing
    and nothing is counted, so its steps run as they would in a user's
    process (the meter's hook on every allocation and free, and the
    collectives it holds until their inputs are freed, cost a step time)."""
    peak = allocated = 0

    def mark(self, label):
        pass

    def timeline(self):
        return []


def worker(rank, args, queue):
    sys.path.insert(0, HERE)
    import torch
    if args.unmetered:
        meter = Unmetered()
    else:
        import shardfit_meter
        meter = shardfit_meter.Meter()  # before anything of the job is allocated
    import torch.distributed as dist
    import models

    torch.set_num_threads(rank_threads(args.nproc))
    # A rank that fails takes the job down: launch() ends the others,
    # and no collective waits longer than this for a rank that is gone.
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=rank,
                            world_size=args.nproc, timeout=datetime.timedelta(seconds=120))
    # Gloo's reduce_scatter_tensor all-reduces a clone of its input; the
    # worker thread that ran it holds the clone until it loops again, which
    # under load is after wait() has returned and the step has gone on. FSDP1
    # and FSDP2 call it synchronously (dist.reduce_scatter_tensor, looked up at
    # each call), so each such call here returns once the clone is freed: the
    # program order the plan simulates. Nothing more is allocated.
    # all_gather_into_tensor (FSDP2's, synchronous on a CPU): its work object
    # holds views of the caller's output buffer, so the caller's free of it
    # is the worker thread's whenever the worker drops the work late (FSDP2's
    # 262,400-byte root buffer on transformers' Qwen2 at 1 x 8, held into the
    # next group's all-gather): each such call returns once the worker has
    # let go.
    # DDP's broadcasts of the module's state at init and of its buffers before
    # a forward: dist._broadcast_coalesced (looked up at each call, always
    # synchronous) flattens the tensors into buckets that Gloo's worker thread
    # holds the same way.
    settled = {}
    if not args.unmetered:
        settled = {"reduce_scatter_tensor": made_during(meter), "all_gather_into_tensor": views_of_arguments(torch),
                   "_broadcast_coalesced": made_during(meter)}
        for name, hold in settled.items():
            settled[name] = Settled(getattr(dist, name), hold)
            setattr(dist, name, settled[name])
    mesh = None
    if args.wrap.startswith("fsdp2"):
        # FSDP2's 1-D mesh over the Gloo ranks, made with the process group
        # (its rank tensor is part of the group's set-up, not of the job).
        from torch.distributed.device_mesh import init_device_mesh
        if args.fsdp_mesh:  # HSDP: (replicate, shard), replicated on dim 0
            shape = tuple(int(x) for x in args.fsdp_mesh.split("x"))
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (args.nproc,))
    if not args.unmetered:
        meter.reset_peak()
    base = meter.allocated  # bytes of the process group, before the job (0 seen)
    if args.budget:
        meter.set_budget(base + args.budget)
    alloc_log = None
    if args.log_allocations:  # every allocation, after the last point marked
        marks = ["before init"]
        mark = meter.mark
        meter.mark = lambda label: (mark(label), marks.append(label))
        alloc_log = meter.log_allocations(lambda: marks[-1])
    try:
        result = train(args, rank, meter, torch, models, mesh)
    except RuntimeError as e:
        if "out of memory" not in str(e):
            raise
        result = {"rank": rank, "oom": str(e).split("\n")[0], "peak_allocated_bytes": meter.peak - base,
                  "timeline": rebase(meter.timeline(), base)}
        queue.put(result)
        raise SystemExit(3)  # the other ranks are ended by launch()
    result["peak_allocated_bytes"] = meter.peak - base
    rebase(result["timeline"], base)
    # The calls, per collective, whose worker thread still held what they
    # made or were given when they returned (each waited for it); and those
    # that gave up after the timeout: their frees are the thread timing's again.
    waited = {name: c.waited for name, c in settled.items() if c.waited}
    if waited:
        result["waited_collectives"] = waited
    unsettled = sum(c.unsettled for c in settled.values())
    if unsettled:
        result["unsettled_collectives"] = unsettled
    if alloc_log is not None:
        with open("%s.rank%d.json" % (args.log_allocations, rank), "w") as f:
            json.dump(list(alloc_log), f, indent=0)
    queue.put(result)
    dist.barrier()
    dist.destroy_process_group()


def rebase(timeline, base):
    """The timeline's bytes counted from `base`, as the peak is: what the
    process group (and FSDP2's device mesh) hold is not the job's."""
    for p in timeline:
        p["allocated_bytes"] -= base
        p["peak_allocated_bytes"] -= base
    return timeline


def reduce_dtype(torch, args):
    """--fsdp-bf16's reduce_dtype (--fsdp-reduce-dtype)."""
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[args.fsdp_reduce_dtype]


def fully_shard_blocks(torch, model, args, mesh):
    """FSDP2 as its examples apply it: fully_shard on every block (in module
    order), then on the root; reshard_after_forward True for fsdp2-zero3,
    False for fsdp2-zero2; with --fsdp-bf16 MixedPrecisionPolicy(bf16
    parameters, fp32 reduction)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = dict(mesh=mesh, reshard_after_forward=args.wrap == "fsdp2-zero3")
    if args.fsdp_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy
        # pin_memory=True (the default) pins each shard (_fsdp_param.py
        # _init_sharded_param: padded_sharded_param.pin_memory()), which
        # torch 2.11 refuses on a host with no CUDA driver.
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=args.fsdp_offload == "pinned")
    if args.fsdp_bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype(torch, args))
    blocks = [m for m in model.modules() if isinstance(m, model.block_class)]
    for m in blocks:
        fully_shard(m, **kw)
    fully_shard(model, **kw)
    n = args.fsdp_prefetch
    if n >= 2:
        # Explicit prefetching as PyTorch's FSDP2 example sets it on the
        # blocks (plan --prefetch N, planner/launch_config.cc's lists): N - 1
        # blocks ahead in the forward, N back in the backward.
        for i, m in enumerate(blocks):
            if i + n - 1 < len(blocks):
                m.set_modules_to_forward_prefetch(blocks[i + 1:i + n])
            if i >= n:
                m.set_modules_to_backward_prefetch([blocks[i - j] for j in range(1, n + 1)])
    return model


def fsdp1_blocks(torch, model, args):
    """FSDP1 as transformer_auto_wrap_policy wraps it: every block its own
    FullyShardedDataParallel unit, the root the rest; or, with
    --fsdp-min-params N, as size_based_auto_wrap_policy(min_num_params=N)
    does (the plan's wrap=size:N). On the CPU (device_id=cpu), FULL_SHARD for
    fsdp1-zero3, SHARD_GRAD_OP for fsdp1-zero2, NO_SHARD for fsdp1-noshard,
    the other options at their defaults (BACKWARD_PRE); with --fsdp-bf16
    MixedPrecision(bf16 parameters and buffers, fp32 reduction)."""
    import functools
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
    strategy = {"fsdp1-zero3": ShardingStrategy.FULL_SHARD, "fsdp1-zero2": ShardingStrategy.SHARD_GRAD_OP,
                "fsdp1-noshard": ShardingStrategy.NO_SHARD}[args.wrap]
    policy = (functools.partial(size_based_auto_wrap_policy, min_num_params=args.fsdp_min_params)
              if args.fsdp_min_params else ModuleWrapPolicy({model.block_class}))
    kw = {}
    if args.fsdp_bf16:
        # As the plan's FSDP1 bf16 candidates export it with
        # --fsdp-reduce-dtype fp32 (planner/launch_config.cc).
        from torch.distributed.fsdp import MixedPrecision
        kw["mixed_precision"] = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype(torch, args),
                                               buffer_dtype=torch.bfloat16)
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, sharding_strategy=strategy,
                                    device_id=torch.device("cpu"), use_orig_params=args.fsdp_use_orig_params, **kw)


def train(args, rank, meter, torch, models, mesh=None):
    """The job on this rank; returns its losses and timeline."""
    torch.manual_seed(args.seed)
    model, batch_of = build_model(args, torch, models)
    model.train()
    if args.ckpt or args.ckpt_reentrant:
        checkpoint_blocks(torch, model, reentrant=args.ckpt_reentrant)
    if args.hf_gradient_checkpointing:
        if not args.model.startswith("hf:"):
            raise SystemExit("validate.py: --hf-gradient-checkpointing is transformers' own; --model %s is not "
                             "hf:<Architecture>" % args.model)
        model.gradient_checkpointing_enable()  # transformers 5.17: {"use_reentrant": False}
    if args.wrap.startswith("fsdp2"):
        ddp = fully_shard_blocks(torch, model, args, mesh)
    elif args.wrap.startswith("fsdp1"):
        ddp = fsdp1_blocks(torch, model, args)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=(args.wrap == "ddp-bv"),
                                                        static_graph=args.static_graph,
                                                        bucket_cap_mb=args.bucket_cap_mb)
    if args.wrap == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        # foreach reaches the local AdamW through ZeroRedundancyOptimizer's
        # **defaults (zero_redundancy_optimizer.py __init__).
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=6e-4,
                                      weight_decay=0.01, **adamw_implementation(args))
    else:
        # foreach=True: the multi-tensor step, fused=True: one kernel (plan
        # --adamw-step foreach or fused); 1.13's
        # default on CPU tensors is the for-loop one.
        opt = torch.optim.AdamW(ddp.parameters(), lr=6e-4, weight_decay=0.01, **adamw_implementation(args))
    gen = torch.Generator().manual_seed(args.seed + 1 + rank)
    meter.mark("init")
    losses, step_times = [], []
    for step in range(1, args.steps + 1):
        started = time.perf_counter()  # wall time of the step, marks included (they allocate nothing)
        opt.zero_grad(set_to_none=args.zero_grad == "none")
        for micro in range(1, args.grad_accum + 1):
            # --grad-accum N: every micro-batch but the last under no_sync()
            # (gradients summed: scale the learning rate, not the loss).
            label = "step%d" % step if args.grad_accum == 1 else "step%d.%d" % (step, micro)
            sync = contextlib.nullcontext() if micro == args.grad_accum else ddp.no_sync()  # DDP only
            with sync:
                x = batch_of(gen)
                # `outputs = model(...)`: what the forward returned beside the loss
                # (a Hugging Face-style model's logits, keys and values) is held until
                # the next forward returns, as run_clm_no_trainer.py's loop held it.
                if args.bf16:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        outputs = ddp(*x)
                else:
                    outputs = ddp(*x)
                # A tuple's first, or a transformers ModelOutput's (its loss).
                loss = outputs[0] if isinstance(outputs, (tuple, dict)) else outputs
                if args.loop_keeps == "loss":
                    # `loss = loss_fn(model, x)`: the rest goes as the loss
                    # function returns; the loss stays until the next one.
                    del outputs
                meter.mark(label + "/forward")
                loss.backward()
            losses.append(loss.item())
            del x
            if args.loop_keeps == "outputs":
                del loss  # `outputs` holds it
            meter.mark(label + "/backward")
        opt.step()
        meter.mark("step%d/optimizer" % step)
        step_times.append(time.perf_counter() - started)
    return {"rank": rank, "timeline": meter.timeline(), "losses": losses, "step_times_s": step_times}


def adamw_implementation(args):
    """AdamW's keyword for --foreach or --fused (the plan's --adamw-step);
    neither: foreach=False, the for-loop step, as the plan's for-loop."""
    return {"fused": True} if args.fused else {"foreach": args.foreach}


def build_model(args, torch, models):
    """The model (pytorch/models.py's by name, or transformers' own class
    from --config for hf:<Architecture>, pytorch/hf_models.py, built with
    random weights on the CPU) and its batch: a function of the rank's
    generator returning the forward's arguments, made as the recorder's
    input function makes them (token ids; for hf: then the tokenizer's
    all-ones attention mask)."""
    if not args.model.startswith("hf:"):
        vocab = models.vocab_size(args.model)
        return models.build(args.model), lambda gen: (
            torch.randint(0, vocab, (args.batch, args.seq_len), generator=gen),)
    import hf_models
    build, _, _ = hf_models.factory(args.model[3:], args.config)
    model = build()
    vocab = model.config.vocab_size
    return model, lambda gen: (torch.randint(0, vocab, (args.batch, args.seq_len), generator=gen),
                               torch.ones(args.batch, args.seq_len, dtype=torch.long))


def checkpoint_blocks(torch, model, reentrant=False):
    """Each block's forward under torch.utils.checkpoint (use_reentrant as
    given: False by default here, True is 1.13's default); a model with
    use_cache turns it off (as Hugging Face's do under gradient
    checkpointing)."""
    import functools
    from torch.utils.checkpoint import checkpoint
    if hasattr(model, "use_cache"):
        model.use_cache = False
    for m in model.modules():
        if isinstance(m, model.block_class):
            inner = m.forward
            # Keyword arguments (a transformers block's mask) bound, as
            # transformers binds them: the reentrant kind takes none.
            m.forward = lambda *a, _f=inner, **kw: checkpoint(functools.partial(_f, **kw), *a,
                                                              use_reentrant=reentrant)


def rank_context(preload=("torch",)):
    """Where the ranks start: the standard library's forkserver, a server
    that imports `preload` once (torch: about 3 s on a 2-core host) and forks
    each rank from that clean, single-threaded state, as PyTorch's own
    DataLoader workers start from an imported torch. The server lives as
    long as this process: a caller that runs many jobs (pytorch-validate)
    pays the import once. Nothing of a job is allocated before its rank
    installs the meter, so what the meter counts is as in a fresh
    interpreter."""
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx


def launch(target, args, nproc, ctx=None, timeout_s=600):
    """Run target(rank, args, queue) in `nproc` ranks started from `ctx`
    (rank_context() when None) and return what the ranks put on the queue.
    The first rank to fail ends the others, as torchrun's agent does, so
    none waits on a collective for a rank that is gone. A rank out of
    memory reports, then exits 3 (or is aborted by Gloo's threads as it
    goes), and its peers' collectives may fail with it as its connections
    close, whichever exits first: a job where a rank reported running out
    of memory is that result. Otherwise a rank that fails before it
    reports is an error naming the first seen and its exit code (its
    traceback is on stderr above), and so are ranks still running after
    `timeout_s`."""
    from multiprocessing.connection import wait
    ctx = ctx or rank_context()
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(rank, args, queue), name="rank%d" % rank) for rank in range(nproc)]
    deadline = time.monotonic() + timeout_s
    reported, failed = [], None
    try:
        for p in procs:
            p.start()
        live = list(procs)
        while live:
            # The queue drained as the ranks go: a rank's put() blocks while
            # the pipe is full, and it cannot exit until its report is read.
            wait([p.sentinel for p in live], timeout=0.1)
            while not queue.empty():
                reported.append(queue.get())
            for p in [p for p in live if p.exitcode is not None]:
                live.remove(p)
                if p.exitcode != 0 and failed is None:
                    failed = p
                    for other in live:
                        other.terminate()
            if live and time.monotonic() > deadline:
                raise SystemExit("validate.py: %s still running after %d s" % (", ".join(p.name for p in live),
                                                                              timeout_s))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    while not queue.empty():
        reported.append(queue.get())
    if failed is not None and not any("oom" in r for r in reported):
        raise SystemExit("validate.py: %s exited with code %d before it reported (see its error above)"
                         % (failed.name, failed.exitcode))
    return reported


def run(args, ctx=None):
    ranks = sorted(launch(worker, args, args.nproc, ctx), key=lambda r: r["rank"])
    if not ranks:
        raise SystemExit("validate.py: no rank reported (see the errors above)")
    return {"model": args.model, "wrap": args.wrap, "ckpt": args.ckpt, "bf16": args.bf16, "zero_grad": args.zero_grad,
            "loop_keeps": args.loop_keeps,
            "nproc": args.nproc, "batch": args.batch, "seq_len": args.seq_len, "steps": args.steps,
            "grad_accum": args.grad_accum,
            "ranks": ranks}


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-tiny",
                   help="a model of pytorch/models.py, or hf:<Architecture> (transformers' own class, with --config)")
    p.add_argument("--config", help="--model hf:...: a transformers config.json (pytorch/hf_models.py)")
    p.add_argument("--wrap", choices=["ddp", "ddp-bv", "zero1", "fsdp2-zero3", "fsdp2-zero2",
                                       "fsdp1-zero3", "fsdp1-zero2", "fsdp1-noshard"], default="ddp")
    p.add_argument("--fsdp-bf16", action="store_true",
                   help="FSDP2's MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32); "
                        "FSDP1's MixedPrecision(the same, buffer_dtype=torch.bfloat16)")
    p.add_argument("--fsdp-reduce-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="--fsdp-bf16's reduce_dtype (plan --fsdp-reduce-dtype fp32, or param for bf16)")
    p.add_argument("--fsdp-prefetch", type=int, default=0, metavar="N",
                   help="FSDP2, N >= 2: each block's set_modules_to_forward_prefetch(the next N - 1 blocks) and, from "
                        "block N on, set_modules_to_backward_prefetch(the N before it) (plan --prefetch N)")
    p.add_argument("--fsdp-mesh", metavar="RxS",
                   help="FSDP2 on a 2-D mesh (HSDP): R replicas of S-rank shard groups, R x S = --nproc")
    p.add_argument("--fsdp-min-params", type=int, default=0, metavar="N",
                   help="fsdp1-*: size_based_auto_wrap_policy(min_num_params=N) instead of one unit per block "
                        "(the plan's wrap=size:N)")
    p.add_argument("--fsdp-use-orig-params", action="store_true",
                   help="fsdp1-*: FullyShardedDataParallel(use_orig_params=True) (plan --fsdp-use-orig-params)")
    p.add_argument("--fsdp-offload", choices=["pinned", "unpinned"],
                   help="FSDP2's CPUOffloadPolicy(pin_memory=True, its default, or False); pinned needs a CUDA "
                        "driver, even for a CPU mesh")
    p.add_argument("--ckpt", action="store_true")
    p.add_argument("--ckpt-reentrant", action="store_true",
                   help="every block under torch.utils.checkpoint(use_reentrant=True), 1.13's default")
    p.add_argument("--hf-gradient-checkpointing", action="store_true",
                   help="transformers' model.gradient_checkpointing_enable() (hf: models): the plan's +ckpt")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--zero-grad", choices=["none", "zero"], default="none",
                   help="opt.zero_grad(set_to_none=True) (none: PyTorch 2.x's default) or set_to_none=False "
                        "(zero: PyTorch 1.x's default, the gradients zeroed in place)")
    p.add_argument("--loop-keeps", choices=["outputs", "loss"], default="outputs",
                   help="what the loop holds until the next forward: outputs (`outputs = model(x)`) or the loss "
                        "alone (`loss = loss_fn(model, x)`; plan --loop-keeps)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    step = p.add_mutually_exclusive_group()  # one AdamW implementation; neither: the for-loop on CPU tensors
    step.add_argument("--foreach", action="store_true", help="torch.optim.AdamW(foreach=True)")
    step.add_argument("--fused", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP(bucket_cap_mb=...), PyTorch's default 25")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step, all but the last under DDP.no_sync()")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--log-allocations", metavar="PREFIX",
                   help="write every rank's allocations and releases to PREFIX.rankN.json (slow: not for "
                        "measuring)")
    p.add_argument("--unmetered", action="store_true",
                   help="run without the meter, for the steps' wall time alone: no peak, timeline or budget")
    p.add_argument("--budget", type=int, default=0,
                   help="bytes each rank may hold (the meter's budget; 0: none): past it, PyTorch's OOM")
    return p


if __name__ == "__main__":
    cli = parser()
    parsed = cli.parse_args()
    if parsed.unmetered and (parsed.budget or parsed.log_allocations):
        cli.error("--unmetered meters nothing: not with --budget or --log-allocations")
    print(json.dumps(run(parsed)))
