#!/usr/bin/env python3
"""What torch.optim.AdamW's step costs to dispatch on this machine, for
`shardfit calibrate --stack pytorch`.

    .venv/bin/python pytorch/calibrate_stack.py --threads 1 [--out FILE]

A `--stack pytorch` plan times AdamW's step as its bytes over the memory
bandwidth plus the cost of dispatching its ops. For a model of many small
parameters the dispatch is most of it, and it depends on what the
parameters are: plain tensors (DDP, ZeroRedundancyOptimizer, FSDP1's flat
parameters) or FSDP2's DTensors, each of whose ops goes through DTensor's
Python dispatch (sharding propagation, then the local op). Propagation is
cached by the op's arguments, scalars included, and the for-loop step's
`param.addcdiv_(exp_avg, denom, value=-step_size)` has a step size that
changes every step: each step misses the cache once for every distinct
parameter shape, and that miss is propagated on fake tensors (about a
millisecond on a 2-core EPYC VM).

So this measures the whole step, for each of the three steps torch 2.11
has (for-loop, foreach, fused) on each kind of tensor, over 1 parameter, 32
of one shape and 32 of 32 shapes (64 to 126 fp32 elements: their bytes are
nothing beside the dispatch): a fixed cost, one a tensor and one a distinct
shape, fixed_s + per_tensor_s x tensors + per_shape_s x shapes. The
DTensors are Shard(0) on a one-rank CPU mesh: what a rank of a larger mesh
dispatches for a pointwise op is the same (no collective), only its local
shard differs.

Each figure is the median of 9 samples of at least 5 ms of steps, after one
step that creates the state and one that warms up. Writes one JSON object,
{"adamw_steps": {"for-loop": {"tensor": {"fixed_s": ..., "per_tensor_s":
..., "per_shape_s": ...}, "dtensor": {...}}, "foreach": {...}, "fused":
{...}}, "torch": ...}, to --out (default: stdout). A step this PyTorch
cannot run (fused over DTensors, say) is left out."""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

ELEMENTS = 64
MANY = 32


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads, as each rank of the job gets")
    ap.add_argument("--out", help="where to write the JSON (default: stdout)")
    a = ap.parse_args()
    if a.threads < 1:
        raise SystemExit("calibrate_stack.py: --threads %d: must be at least 1" % a.threads)
    torch.set_num_threads(a.threads)
    from torch.distributed.device_mesh import init_device_mesh

    # A world of one over an in-process store: no port, no peer.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    steps = {}
    for which in ("for-loop", "foreach", "fused"):
        for kind in ("tensor", "dtensor"):
            try:
                steps.setdefault(which, {})[kind] = dispatch_line(kind, which, mesh)
            except (RuntimeError, NotImplementedError) as e:
                print("calibrate_stack.py: AdamW %s over %ss not measured: %s" % (which, kind, str(e).split("\n")[0]),
                      file=sys.stderr)
    dist.destroy_process_group()
    text = json.dumps({"adamw_steps": steps, "torch": torch.__version__.split("+")[0]})
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
