#!/usr/bin/env python3
"""What PyTorch's own machinery costs on this machine beside the model's
kernels, for `shardfit calibrate --stack pytorch`: torch.optim.AdamW's step,
FSDP's hooks and DDP's.

    .venv/bin/python pytorch/calibrate_stack.py --threads 1 [--nproc 2] [--out FILE]

AdamW. A `--stack pytorch` plan times AdamW's step as its bytes over the
memory bandwidth plus the cost of dispatching its ops. For a model of many
small parameters the dispatch is most of it, and it depends on what the
parameters are: plain tensors (DDP, ZeroRedundancyOptimizer, FSDP1's flat
parameters) or FSDP2's DTensors, each of whose ops goes through DTensor's
Python dispatch (sharding propagation, then the local op). Propagation is
cached by the op's arguments, scalars included, and the for-loop step's
`param.addcdiv_(exp_avg, denom, value=-step_size)` has a step size that
changes every step: each step misses the cache once for every distinct
parameter shape, and that miss is propagated on fake tensors (about a
millisecond on a 2-core EPYC VM). So this measures the whole step, for each
of the three steps torch 2.11 has (for-loop, foreach, fused) on each kind of
tensor, over 1 parameter, 32 of one shape and 32 of 32 shapes (64 to 126
fp32 elements: their bytes are nothing beside the dispatch): a fixed cost,
one a tensor and one a distinct shape, fixed_s + per_tensor_s x tensors +
per_shape_s x shapes. The DTensors are Shard(0) on a one-rank CPU mesh: what
a rank of a larger mesh dispatches for a pointwise op is the same (no
collective), only its local shard differs. Each figure is the median of 9
samples of at least 5 ms of steps, after one step that creates the state
and one that warms up.

FSDP. FSDP wraps each unit's forward and backward in Python: hooks that
all-gather the unit's parameters (copied into one flat buffer first, then
out into each parameter, or viewed from FSDP1's flat parameter), free them
again, and reduce-scatter the gradients (copied in and out the same way).
On a CPU, for small layers, these cost far more than the link's latency
the collectives would pay alone (about 1.5 ms a collective against 0.2 ms
on 2 ranks of a 2-core VM), and most of it is not the collective: the
copies' dispatch, the hooks, and the wait for the other ranks. So this runs
--nproc ranks over Gloo, as the job will, and measures the forward and the
backward of 1 group of 1 bias-free Linear(64, 64), 8 groups of 1 and 8 of
8, each group wrapped (FSDP1: FullyShardedDataParallel, a unit a group;
FSDP2: fully_shard on each group, then on the root, which holds no
parameter of its own), each less the same model unwrapped: per phase a
fixed cost, one a group and one a parameter, for FULL_SHARD or
reshard_after_forward=True ("zero3") and SHARD_GRAD_OP or False ("zero2").
Their bytes are nothing: the plan adds a collective's bytes over the link's
rate, and no latency beside this. Each figure is a median of 31 steps; a
difference that comes out negative (noise) is 0.

DDP. DistributedDataParallel's Reducer hooks each parameter's gradient:
it copies the gradient into its bucket (gradient_as_bucket_view=False, the
default) and, once a bucket is full, all-reduces it over Gloo, then waits
for every bucket at the end of backward and copies the results back; before
each forward it broadcasts the module's buffers from rank 0
(broadcast_buffers=True), if it has any. On the same ranks this measures
its forward and backward the same way (wrapped less unwrapped, median of 31
steps): 1 bias-free Linear(64, 64) in 1 bucket, 32 in 1 bucket (16 KiB each,
under DDP's 1 MiB first bucket) and 32 in 32 (bucket_cap_mb=1/64: a bucket
a parameter, the buckets DDP reduced checked from its logging data), as a
fixed cost, one a bucket and one a parameter, with
gradient_as_bucket_view False ("copy") and True ("view"); and 1 Linear with
one 64-element buffer, less without: the buffers' broadcast a forward
("ddp_buffers_s").

ZeroRedundancyOptimizer. After its step it broadcasts each parameter from
the rank that stepped it, from Python, each broadcast issued async_op=True
and then all waited for: on the same ranks, 32 broadcasts of 64 fp32 so
issued (each rank's share from it, in rank order), per broadcast, median of
31 rounds ("broadcast_s"). A plan pays it a broadcast in place of the link's
latency.

Writes one JSON object to --out (default: stdout): {"adamw_steps":
{"for-loop": {"tensor": {"fixed_s": ..., "per_tensor_s": ...,
"per_shape_s": ...}, "dtensor": {...}}, "foreach": {...}, "fused": {...}},
"fsdp1_hooks": {"zero3": {"forward": {"fixed_s": ..., "per_group_s": ...,
"per_param_s": ...}, "backward": {...}}, "zero2": {...}}, "fsdp2_hooks":
{...}, "ddp_hooks": {"copy": {"forward": {"fixed_s": ..., "per_bucket_s":
..., "per_param_s": ...}, "backward": {...}}, "view": {...}},
"ddp_buffers_s": ..., "broadcast_s": ..., "not_measured":
[...], "torch": ...}. An AdamW step this PyTorch cannot run (fused over
DTensors, say) is left out and named, with its reason, in not_measured. A
rank of the FSDP probe that fails takes the others down, and this exits
non-zero."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import rank_exit  # pytorch/rank_exit.py, beside this script

ELEMENTS = 64
MANY = 32
# The FSDP probe: 1 group of 1 parameter, GROUPS of 1, GROUPS of
# GROUP_PARAMS (launch/calibrate.cc's sources name these).
GROUPS = 8
GROUP_PARAMS = 8
SAMPLES = 31


def seconds_per_step(step):
    step()  # the state
    step()
    reps = 1
    while True:
        t = time.perf_counter()
        for _ in range(reps):
            step()
        if time.perf_counter() - t >= 5e-3:
            break
        reps *= 2
    samples = []
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(reps):
            step()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def adamw_seconds(kind, which, sizes, mesh):
    """Seconds a step of AdamW (`which`) takes over 1-D parameters of `sizes`."""
    from torch.distributed.tensor import Shard, distribute_tensor

    params = []
    for n in sizes:
        data = torch.randn(n)
        if kind == "dtensor":
            data = distribute_tensor(data, mesh, [Shard(0)])
        p = torch.nn.Parameter(data)
        p.grad = torch.randn_like(p)
        params.append(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=which == "foreach", fused=which == "fused")
    return seconds_per_step(opt.step)


def dispatch_line(kind, which, mesh):
    """fixed_s, per_tensor_s and per_shape_s of AdamW (`which`) over `kind`s."""
    one = adamw_seconds(kind, which, [ELEMENTS], mesh)
    alike = adamw_seconds(kind, which, [ELEMENTS] * MANY, mesh)
    apart = adamw_seconds(kind, which, [ELEMENTS + 2 * i for i in range(MANY)], mesh)
    per_tensor = max(0.0, (alike - one) / (MANY - 1))
    per_shape = max(0.0, (apart - alike) / (MANY - 1))
    return {"fixed_s": max(0.0, one - per_tensor - per_shape), "per_tensor_s": per_tensor, "per_shape_s": per_shape}


def phase_seconds(model, x):
    """Median seconds of `model`'s forward and of its backward, on `x`."""
    for _ in range(3):  # FSDP's lazy init, then warm
        model(x).sum().backward()
    forward, backward = [], []
    for _ in range(SAMPLES):
        t = time.perf_counter()
        loss = model(x).sum()
        t1 = time.perf_counter()
        loss.backward()
        forward.append(t1 - t)
        backward.append(time.perf_counter() - t1)
    return statistics.median(forward), statistics.median(backward)


class Group(torch.nn.Sequential):
    """A block of the FSDP probe's model: what FSDP1's ModuleWrapPolicy wraps
    and FSDP2's fully_shard is applied to."""


def wrap(version, model, reshard, mesh):
    """`model` under FSDP `version` (1: FullyShardedDataParallel on the CPU,
    each Group a unit, FULL_SHARD or, without `reshard`, SHARD_GRAD_OP; 2:
    fully_shard on each Group, then on the root), as the plan's candidates
    wrap by block; the root holds no parameter of its own."""
    if version == 2:
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        return fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy.FULL_SHARD if reshard else ShardingStrategy.SHARD_GRAD_OP
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Group}), sharding_strategy=strategy,
                                    device_id=torch.device("cpu"))


def fsdp_seconds(version, groups, params, reshard, mesh):
    """What FSDP `version` adds to a forward and a backward: `groups` blocks
    of `params` bias-free Linear(64, 64) each, less the same model
    unwrapped."""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[Group(*[torch.nn.Linear(ELEMENTS, ELEMENTS, bias=False) for _ in range(params)])
                                     for _ in range(groups)])

    x = torch.randn(16, ELEMENTS)
    plain = phase_seconds(build(), x)
    wrapped = phase_seconds(wrap(version, build(), reshard, mesh), x)
    return [max(0.0, w - p) for w, p in zip(wrapped, plain)]


def fsdp_lines(version, reshard, mesh):
    """Per phase, fixed_s, per_group_s and per_param_s of FSDP `version`'s hooks."""
    one = fsdp_seconds(version, 1, 1, reshard, mesh)
    groups = fsdp_seconds(version, GROUPS, 1, reshard, mesh)
    params = fsdp_seconds(version, GROUPS, GROUP_PARAMS, reshard, mesh)
    lines = {}
    for i, phase in enumerate(("forward", "backward")):
        per_group = max(0.0, (groups[i] - one[i]) / (GROUPS - 1))
        per_param = max(0.0, (params[i] - groups[i]) / (GROUPS * (GROUP_PARAMS - 1)))
        lines[phase] = {"fixed_s": max(0.0, one[i] - per_group - per_param), "per_group_s": per_group,
                        "per_param_s": per_param}
    return lines


def ddp_seconds(params, cap_mb, bucket_view, buffer=False):
    """What DistributedDataParallel adds to a forward and a backward of
    `params` bias-free Linear(64, 64) (with `buffer`, one 64-element buffer
    too, which it broadcasts before each forward), buckets capped at
    `cap_mb` (None: DDP's default, 25 MiB after a first of 1 MiB), less the
    same model unwrapped; and the buckets it reduced in its last backward."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(ELEMENTS, ELEMENTS, bias=False) for _ in range(params)])
        if buffer:
            model.register_buffer("probe", torch.zeros(ELEMENTS))
        return model

    x = torch.randn(16, ELEMENTS)
    plain = phase_seconds(build(), x)
    ddp = torch.nn.parallel.DistributedDataParallel(build(), bucket_cap_mb=cap_mb,
                                                    gradient_as_bucket_view=bucket_view)
    wrapped = phase_seconds(ddp, x)
    buckets = ddp._get_ddp_logging_data()["num_buckets_reduced"]
    return [max(0.0, w - p) for w, p in zip(wrapped, plain)], buckets


def ddp_lines(bucket_view):
    """Per phase, fixed_s, per_bucket_s and per_param_s of DDP's hooks
    (gradient_as_bucket_view=`bucket_view`)."""
    one, one_buckets = ddp_seconds(1, None, bucket_view)
    params, params_buckets = ddp_seconds(MANY, None, bucket_view)  # 32 x 16 KiB: under the first bucket's 1 MiB
    buckets, many_buckets = ddp_seconds(MANY, ELEMENTS * ELEMENTS * 4 / 2**20, bucket_view)  # a bucket each
    if (one_buckets, params_buckets, many_buckets) != (1, 1, MANY):
        raise RuntimeError("DDP probe: expected 1, 1 and %d buckets, DDP reduced %d, %d and %d"
                           % (MANY, one_buckets, params_buckets, many_buckets))
    lines = {}
    for i, phase in enumerate(("forward", "backward")):
        per_param = max(0.0, (params[i] - one[i]) / (MANY - 1))
        per_bucket = max(0.0, (buckets[i] - params[i]) / (MANY - 1))
        lines[phase] = {"fixed_s": max(0.0, one[i] - per_param - per_bucket), "per_bucket_s": per_bucket,
                        "per_param_s": per_param}
    return lines


def ddp_buffers_seconds():
    """What DDP's broadcast of the module's buffers adds to its forward: 1
    Linear with one buffer less the same without."""
    return max(0.0, ddp_seconds(1, None, False, buffer=True)[0][0] - ddp_seconds(1, None, False)[0][0])


def broadcast_seconds(nproc):
    """One dist.broadcast of a parameter as ZeroRedundancyOptimizer's
    _sync_params issues them after its step (without
    parameters_as_bucket_view): each rank's partition from that rank, in
    rank order, every one async_op=True, then every handle waited for; over
    MANY parameters of ELEMENTS fp32 (their bytes are nothing), the median
    of SAMPLES rounds, a parameter."""
    params = [torch.randn(ELEMENTS) for _ in range(MANY)]

    def sync():
        handles = [dist.broadcast(p, src=i * nproc // MANY, async_op=True) for i, p in enumerate(params)]
        for h in handles:
            h.wait()

    sync()
    samples = []
    for _ in range(SAMPLES):
        dist.barrier()
        t = time.perf_counter()
        sync()
        samples.append((time.perf_counter() - t) / MANY)
    return statistics.median(samples)


def collectives_rank(rank, nproc, threads, store_path, out):
    """One rank of the collectives' probe: a Gloo group of `nproc` over a
    FileStore; rank 0 writes every figure, {"fsdp1_hooks": ...,
    "fsdp2_hooks": ..., "broadcast_s": ..., "ddp_hooks": ...,
    "ddp_buffers_s": ...}, to `out`."""
    from datetime import timedelta

    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, nproc)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nproc, timeout=timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (nproc,))
    hooks = {}
    for version in (1, 2):
        for name, reshard in (("zero3", True), ("zero2", False)):
            hooks.setdefault("fsdp%d_hooks" % version, {})[name] = fsdp_lines(version, reshard, mesh)
    hooks["broadcast_s"] = broadcast_seconds(nproc)
    hooks["ddp_hooks"] = {"copy": ddp_lines(False), "view": ddp_lines(True)}
    hooks["ddp_buffers_s"] = ddp_buffers_seconds()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(hooks, f)
    dist.barrier()
    dist.destroy_process_group()
    rank_exit.leave()  # the figures are written and closed


def collectives(nproc, threads):
    """FSDP1's, FSDP2's and DDP's hooks as `nproc` ranks of this machine
    run them, each with `threads` intra-op threads (what each adds to a
    forward and a backward, collectives included), and
    ZeroRedundancyOptimizer's broadcasts. A rank that fails takes the others down
    (torch.multiprocessing.spawn) and this raises."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="shardfit-fsdp2-") as tmp:
        out = os.path.join(tmp, "hooks.json")
        mp.spawn(collectives_rank, args=(nproc, threads, os.path.join(tmp, "store"), out), nprocs=nproc, join=True)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads, as each rank of the job gets")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks the FSDP probe runs (as the job will: `shardfit calibrate --nproc`; at least 2)")
    ap.add_argument("--out", help="where to write the JSON (default: stdout)")
    a = ap.parse_args()
    if a.threads < 1:
        raise SystemExit("calibrate_stack.py: --threads %d: must be at least 1" % a.threads)
    if a.nproc < 2:
        raise SystemExit("calibrate_stack.py: --nproc %d: FSDP's collectives need at least 2 ranks" % a.nproc)
    torch.set_num_threads(a.threads)
    from torch.distributed.device_mesh import init_device_mesh

    # A world of one over an in-process store: no port, no peer.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    steps = {}
    missing = []  # what this PyTorch could not run, each with its reason
    for which in ("for-loop", "foreach", "fused"):
        for kind in ("tensor", "dtensor"):
            try:
                steps.setdefault(which, {})[kind] = dispatch_line(kind, which, mesh)
            except (RuntimeError, NotImplementedError) as e:
                missing.append("AdamW %s over %ss: %s" % (which, kind, str(e).split("\n")[0]))
    dist.destroy_process_group()
    hooks = collectives(a.nproc, a.threads)
    text = json.dumps({"adamw_steps": steps, **hooks, "not_measured": missing, "torch": torch.__version__.split("+")[0]})
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
