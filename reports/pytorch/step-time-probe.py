"""Where a CPU training step's time goes, for reports/pytorch/step-time-*.md.

  step-time-probe.py plain MODEL   one process, no wrapper: a model of
                                   pytorch/models.py at 4 x 64, fp32, one
                                   thread, for-loop AdamW; the median
                                   forward, backward and optimizer step over
                                   10 steps after 2 warm-up steps, and the
                                   ATen ops each phase dispatches
  step-time-probe.py side-by-side MODEL
                                   the same model, step and thread in one
                                   process and then in two at once (no
                                   collective between them: what two
                                   ranks' own compute costs each other):
                                   each one's median forward, backward and
                                   optimizer step over 40 steps after 5
                                   warm-up steps, the two started together
                                   at a barrier
  step-time-probe.py adamw-ops     the ops torch.optim.AdamW's second step
                                   dispatches over 1, 2 and 5 parameters,
                                   for-loop, foreach and fused
                                   (planner/adamw_steps.h adamw_step_ops)
  step-time-probe.py gloo [PORT]   2 Gloo ranks, one thread each: the median
                                   of 200 calls of each collective FSDP and
                                   DDP issue at test size (100 KB fp32), and
                                   one all-gather after 3 small matmuls
  step-time-probe.py phases MODEL WRAP [PORT]
                                   2 Gloo ranks, one thread each, the
                                   model at 4 x 64 under WRAP (ddp, zero1:
                                   DDP and ZeroRedundancyOptimizer; fsdp2:
                                   fully_shard by block, then the root;
                                   fsdp2-zero2: the same with
                                   reshard_after_forward=False; fsdp1,
                                   fsdp1-zero2: FullyShardedDataParallel
                                   on the CPU, a unit a block, FULL_SHARD
                                   or SHARD_GRAD_OP),
                                   for-loop AdamW: rank 0's median forward,
                                   backward and optimizer step over steps 6
                                   to 25; then cProfile over 5 more of
                                   rank 0's opt.step(): the calls of
                                   fake_tensor.py's _dispatch_impl (DTensor
                                   propagating on fake tensors)
  step-time-probe.py ddp-delta MODEL [PORT]
                                   2 Gloo ranks, one thread each: the model
                                   at 4 x 64 plain and under
                                   DistributedDataParallel, a forward and
                                   backward of each in turn (no optimizer),
                                   40 pairs after 5: rank 0's median
                                   forward and backward of each, what DDP
                                   adds, and the buckets it reduced
  step-time-probe.py adamw-shapes  one process, a one-rank mesh:
                                   for-loop AdamW's step over 8 and 32
                                   DTensors of one shape, and of as many
                                   shapes (cProfile over the job's
                                   opt.step() shows where the difference
                                   goes: fake_tensor.py's dispatch, once a
                                   step for each shape)

Run with the pinned stack's Python (.venv/bin/python) on an idle machine."""
import os
import statistics
import sys
import time

import torch


def timed_step(model, opt, x):
    """One training step: the seconds of its forward (with the loss),
    backward and optimizer step (`opt` None: no step, the gradients
    dropped, 0 seconds)."""
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    out = model(x)
    loss = out[0] if isinstance(out, (tuple, dict)) else out
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    if opt is None:
        for p in model.parameters():
            p.grad = None
    else:
        opt.step()
    return t1 - t0, t2 - t1, time.perf_counter() - t2 if opt is not None else 0.0


def plain_job(name, seed):
    """`plain`'s job: the model of pytorch/models.py on one thread, for-loop
    AdamW, and a generator of its batches; (model, opt, vocab, gen)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pytorch"))
    import models

    torch.set_num_threads(1)
    model = models.build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    return model, opt, models.vocab_size(name), torch.Generator().manual_seed(seed)


def plain(name):
    from torch.utils._python_dispatch import TorchDispatchMode

    model, opt, vocab, gen = plain_job(name, 0)
    phases = {"forward": [], "backward": [], "optimizer": []}
    for i in range(12):
        x = torch.randint(0, vocab, (4, 64), generator=gen)
        seconds = timed_step(model, opt, x)
        if i >= 2:
            for k, v in zip(phases, seconds):
                phases[k].append(v)

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    counts = []
    with Count():
        x = torch.randint(0, vocab, (4, 64), generator=gen)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = out[0] if isinstance(out, (tuple, dict)) else out
        counts.append(Count.ops)
        loss.backward()
        counts.append(Count.ops - sum(counts))
        opt.step()
        counts.append(Count.ops - sum(counts))
    for (k, v), n in zip(phases.items(), counts):
        print("%-9s %7.2f ms  %4d ops" % (k, statistics.median(v) * 1e3, n))
    print("step      %7.2f ms" % (sum(statistics.median(v) for v in phases.values()) * 1e3))


def side_by_side_rank(rank, name, barrier, results):
    """One of side-by-side's processes: the model of `plain`, 5 warm-up
    steps, the barrier, then 40 timed steps; its medians to `results`."""
    model, opt, vocab, gen = plain_job(name, rank)
    for _ in range(5):
        timed_step(model, opt, torch.randint(0, vocab, (4, 64), generator=gen))
    barrier.wait()
    times = [timed_step(model, opt, torch.randint(0, vocab, (4, 64), generator=gen)) for _ in range(40)]
    results.put((rank, [statistics.median(t[i] for t in times) for i in range(3)]))


def side_by_side(name):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for n in (1, 2):
        barrier, results = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=side_by_side_rank, args=(r, name, barrier, results)) for r in range(n)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
        for rank, (f, b, o) in got:
            print("%d process(es), #%d: forward %6.2f  backward %6.2f  optimizer %6.2f  ms  (forward + backward %6.2f)"
                  % (n, rank, f * 1e3, b * 1e3, o * 1e3, (f + b) * 1e3))


def adamw_ops():
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    for step, kwargs in (("for-loop", dict(foreach=False)), ("foreach", dict(foreach=True)),
                         ("fused", dict(fused=True))):
        for n in (1, 2, 5):
            params = [torch.nn.Parameter(torch.randn(10)) for _ in range(n)]
            opt = torch.optim.AdamW(params, lr=1e-3, **kwargs)
            for p in params:
                p.grad = torch.randn(10)
            opt.step()  # the first creates the state
            with Count() as count:
                opt.step()
            print("%-8s %d parameters: %3d ops" % (step, n, sum(count.ops.values())),
                  dict(count.ops) if n == 1 else "")


def gloo_rank(rank, port):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    n = 25000  # 100 KB of fp32
    x, out, shard = torch.randn(n), torch.empty(2 * n), torch.empty(n // 2)
    a, b = torch.randn(128, 128), torch.randn(128, 128)

    def median_us(f, reps=200):
        dist.barrier()
        times = []
        for _ in range(reps):
            s = time.perf_counter()
            f()
            times.append(time.perf_counter() - s)
        return statistics.median(times) * 1e6

    def matmuls():
        for _ in range(3):
            torch.mm(a, b)

    def matmuls_then_gather():
        matmuls()
        dist.all_gather_into_tensor(out, x)

    rows = [("all_reduce, 1 element", lambda: dist.all_reduce(torch.ones(1))),
            ("all_gather_into_tensor, 100 KB", lambda: dist.all_gather_into_tensor(out, x)),
            ("reduce_scatter_tensor, 100 KB", lambda: dist.reduce_scatter_tensor(shard, x)),
            ("all_reduce, 100 KB", lambda: dist.all_reduce(x)),
            ("3 matmuls 128^3", matmuls),
            ("3 matmuls, then the all-gather", matmuls_then_gather)]
    results = [(name, median_us(f)) for name, f in rows]
    if rank == 0:
        for name, us in results:
            print("%-32s %8.1f us" % (name, us))
    dist.destroy_process_group()


def adamw_shapes():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    for n in (8, 32):
        for label, sizes in (("one shape", [64] * n), ("%d shapes" % n, [64 + 2 * i for i in range(n)])):
            params = [torch.nn.Parameter(distribute_tensor(torch.randn(k), mesh, [Shard(0)])) for k in sizes]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
            opt.step()
            opt.step()
            samples = []
            for _ in range(5):
                s = time.perf_counter()
                for _ in range(20):
                    opt.step()
                samples.append((time.perf_counter() - s) / 20)
            print("%2d DTensors, %-9s %8.0f us a step" % (n, label + ":", statistics.median(samples) * 1e6))
    dist.destroy_process_group()


def phases_rank(rank, name, wrap, port):
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pytorch"))
    import models

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = models.build(name)
    if wrap in ("fsdp2", "fsdp2-zero2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2,))
        kw = {"reshard_after_forward": False} if wrap == "fsdp2-zero2" else {}
        for m in [m for m in model.modules() if isinstance(m, model.block_class)]:
            fully_shard(m, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    elif wrap in ("fsdp1", "fsdp1-zero2"):
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        strategy = ShardingStrategy.SHARD_GRAD_OP if wrap == "fsdp1-zero2" else ShardingStrategy.FULL_SHARD
        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({model.block_class}),
                                         sharding_strategy=strategy, device_id=torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        if wrap == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                          foreach=False)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randint(0, models.vocab_size(name), (4, 64), generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(25):
        dist.barrier()
        seconds = timed_step(model, opt, x)
        if i >= 5:
            times.append(seconds)
    if rank == 0:
        med = [statistics.median(t[k] for t in times) * 1e3 for k in range(3)]
        print("%s %s: forward %.2f ms, backward %.2f ms, optimizer %.2f ms, step %.2f ms"
              % (name, wrap, med[0], med[1], med[2], sum(med)))
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        opt.step()  # ZeroRedundancyOptimizer's broadcasts: both ranks step
    profiler.disable()
    if rank == 0:
        fake = sum(calls for (path, _, fn), (calls, *_) in pstats.Stats(profiler).stats.items()
                   if path.endswith("fake_tensor.py") and fn == "_dispatch_impl")
        print("%s %s: 5 optimizer steps call fake_tensor.py _dispatch_impl %d times" % (name, wrap, fake))
    dist.destroy_process_group()


def ddp_delta_rank(rank, name, port):
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pytorch"))
    import models

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    plain_model = models.build(name)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(models.build(name))
    x = torch.randint(0, models.vocab_size(name), (4, 64), generator=torch.Generator().manual_seed(rank))

    pairs = []  # (plain, ddp), each (forward, backward, 0)
    for i in range(45):
        pair = (timed_step(plain_model, None, x), timed_step(ddp, None, x))
        if i >= 5:
            pairs.append(pair)
    if rank == 0:
        med = [[statistics.median(p[w][k] for p in pairs) * 1e3 for k in range(2)] for w in range(2)]
        print("%s: plain forward %.2f ms, backward %.2f ms; DDP forward %.2f ms, backward %.2f ms; "
              "DDP adds %.2f ms and %.2f ms; %d bucket(s), %d parameters"
              % (name, med[0][0], med[0][1], med[1][0], med[1][1], med[1][0] - med[0][0], med[1][1] - med[0][1],
                 ddp._get_ddp_logging_data()["num_buckets_reduced"], len(list(plain_model.parameters()))))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "plain":
        plain(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "side-by-side":
        side_by_side(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "adamw-ops":
        adamw_ops()
    elif len(sys.argv) >= 2 and sys.argv[1] == "gloo":
        import torch.multiprocessing as mp
        mp.start_processes(gloo_rank, args=(int(sys.argv[2]) if len(sys.argv) > 2 else 29931,), nprocs=2,
                           start_method="spawn")
    elif len(sys.argv) >= 2 and sys.argv[1] == "adamw-shapes":
        adamw_shapes()
    elif len(sys.argv) >= 4 and sys.argv[1] == "phases":
        import torch.multiprocessing as mp
        mp.start_processes(phases_rank, args=(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 29932),
                           nprocs=2, start_method="spawn")
    elif len(sys.argv) >= 3 and sys.argv[1] == "ddp-delta":
        import torch.multiprocessing as mp
        mp.start_processes(ddp_delta_rank, args=(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 29933),
                           nprocs=2, start_method="spawn")
    else:
        sys.exit(__doc__)
