#!/usr/bin/env python3
"""PyTorch's own DDP and FSDP on the reference scenario's rows, on one GPU:
the largest batch per GPU that fits under a memory cap (by search) and the
step's tokens/s, as an independent reference for `shardfit plan` / `run`.

The model: GPT-2 (Large, XL) built from a config dict with Hugging Face
transformers when it is importable (eager attention, as the 2022 write-up
ran: the attention probabilities are materialised), else a minimal GPT-2 in
plain torch with the same shapes, names and parameter count. Nothing is
downloaded: weights are random.

The loop is `loss = loss_fn(model, x)`: the model's other outputs (the
logits) are freed as the forward returns and the loss is held until the
next one; `shardfit plan --stack pytorch --loop-keeps loss` plans that loop.

World 2 on one GPU: a fake process group (torch.testing's FakeStore, backend
"fake") of world size N, this process as rank 0. Why not a gloo group of one
rank: FSDP's memory depends on the world size (a shard is 1/N of each flat
parameter; all-gather outputs are whole units; reduce-scatter outputs 1/N),
and a real group of one rank *is* a world of one: nothing would be sharded.
The fake group reports size N and completes every collective at once without
moving data, so every buffer FSDP (or DDP's reducer) allocates is allocated
exactly as on rank 0 of N: the memory is rank 0's. What it does not give:
the other ranks' values (losses are meaningless), NCCL's own buffers (outside
the caching allocator anyway), and communication time (tokens/s is an upper
bound for N GPUs; x N assumes perfect scaling).

The cap: torch.cuda.set_per_process_memory_fraction, as shardfit's CUDA meter
does. --cap-mode allocator (default): the caching allocator may reserve
--gpu-mem bytes. --cap-mode card: --gpu-mem is the whole card, less what
this process already holds outside the allocator (context, cuBLAS).

Usage: fsdp_reference.py [--rows-file rows.json] [--gpu-mem 24GiB] [--seq-len 128]
                         [--budget-s S] [--out result.json] [--dry-run]
rows.json: [{"row": 1, "model": "gpt2-large", "world": 2,
             "id": "zero3/fp32/wrap=size:2000", "hint": 15}, ...]
  optional per row: "fsdp": 1 (FullyShardedDataParallel, default) or 2
  (fully_shard); "seq_len"; "attn": "eager" (default) or "sdpa"; "gpu_mem":
  a size, or "card" (the whole card less what this process holds outside the
  allocator); "reduce": "fp32" (MixedPrecision reduce_dtype float32 under
  bf16/fp16; default: the compute dtype); "history_batch": N (after the
  search, one more trial at batch N with the caching allocator's history
  recorded: every alloc/free of the step, written to <out>.row<R>-history.json.gz).
"""
import argparse
import functools
import gc
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_models import MODELS, build_model, count_params, vocab_of  # noqa: E402

# The reference scenario (../shared/reference/seed-tables.json) with the
# 2022 write-up's measured max batch as the search's starting point.
DEFAULT_ROWS = [
    ("gpt2-large", 2, "ddp/fp32/wrap=none", 7),
    ("gpt2-large", 2, "ddp/fp16/wrap=none", 7),
    ("gpt2-large", 2, "zero2/fp32/wrap=size:1000000", 11),
    ("gpt2-large", 2, "zero3/fp32/wrap=size:1000000", 15),
    ("gpt2-large", 2, "zero3/fp32/wrap=size:2000", 15),
    ("gpt2-large", 2, "zero3+offload/fp32/wrap=size:1000000", 20),
    ("gpt2-xl", 2, "ddp/fp32/wrap=none", 0),
    ("gpt2-xl", 2, "zero3/fp32/wrap=size:2000", 5),
    ("gpt2-xl", 1, "zero3+offload/fp32/wrap=size:2000", 10),
    ("gpt2-xl", 2, "zero3+offload/fp32/wrap=size:2000", 14),
]

def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*", text)
    if not m:
        raise SystemExit("--gpu-mem %s: expected e.g. 24GiB, 512MiB or bytes" % text)
    units = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


def parse_candidate(cid):
    """'zero3+offload+ckpt/fp16/wrap=size:2000' -> dict."""
    m = re.fullmatch(r"([a-z0-9_]+)((?:\+[a-z]+)*)/(fp32|fp16|bf16)/wrap=(none|block|size:\d+)", cid)
    if not m:
        raise ValueError("candidate %s: expected SHARDING[+offload][+ckpt]/PRECISION/wrap=POLICY" % cid)
    sharding = {"no_shard": "ddp", "shard_grad_op": "zero2", "full_shard": "zero3"}.get(m.group(1), m.group(1))
    flags = set(filter(None, m.group(2).split("+")))
    return dict(sharding=sharding, offload="offload" in flags, ckpt="ckpt" in flags,
                precision=m.group(3), wrap=m.group(4))


# ---------------------------------------------------------------------------
# wrapping: DDP or FSDP as the candidate says
# ---------------------------------------------------------------------------

def wrap(torch, model, cand, block_class, device, fsdp_version=1, reduce=None):
    """Returns (wrapped model, api description). Raises NotImplementedError
    for what PyTorch has no counterpart of. reduce: "fp32" for
    reduce_dtype=float32 under bf16/fp16, else the compute dtype."""
    import torch.distributed as dist
    if cand["sharding"] == "ddp":
        if cand["offload"]:
            raise NotImplementedError("DDP has no offload")
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        # The fake group's all_reduce future holds no value, and DDP's
        # reducer asserts on that ("expected the hook result is either a
        # Tensor or a TensorList found None", torch 2.11, comm.cpp). This
        # hook hands the bucket back as the default one does after its
        # in-place all_reduce (allreduce_hook in
        # torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py):
        # the same buffers, no allocation of its own, no communication.
        def local_bucket(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        ddp.register_comm_hook(None, local_bucket)
        return ddp, "torch DDP (bucket 25 MiB; comm hook: the bucket unchanged)"
    if cand["sharding"] not in ("zero2", "zero3"):
        raise NotImplementedError("%s: FSDP has no counterpart here (zero1/hybrid)" % cand["sharding"])
    if cand["ckpt"]:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, block_class))
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cand["precision"]]
    reduce_dtype = torch.float32 if reduce == "fp32" else dtype
    if fsdp_version == 2:
        return (wrap_fsdp2(torch, model, cand, block_class, dtype, reduce_dtype),
                "FSDP2 fully_shard (%s)" % ("param %s, reduce %s" % (dtype, reduce_dtype) if dtype else "fp32"))
    try:
        from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy,
                                            FullyShardedDataParallel as FSDP)
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy
    except ImportError:
        raise NotImplementedError("FSDP1 is not in this torch")
    if cand["wrap"] == "none":
        policy = None
    elif cand["wrap"] == "block":
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block_class})
    else:
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=int(cand["wrap"].split(":")[1]))
    mp = MixedPrecision(param_dtype=dtype, reduce_dtype=reduce_dtype, buffer_dtype=dtype) if dtype else None
    fsdp = FSDP(model,
                sharding_strategy=ShardingStrategy.FULL_SHARD if cand["sharding"] == "zero3"
                else ShardingStrategy.SHARD_GRAD_OP,
                auto_wrap_policy=policy, cpu_offload=CPUOffload(offload_params=cand["offload"]),
                mixed_precision=mp, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                device_id=device, limit_all_gathers=True, process_group=dist.group.WORLD)
    return fsdp, "FSDP1 (FullyShardedDataParallel, backward_prefetch BACKWARD_PRE, limit_all_gathers)"


def wrap_fsdp2(torch, model, cand, block_class, dtype, reduce_dtype):
    """fully_shard per unit, then the root (the FSDP2 examples' order)."""
    from torch.distributed.fsdp import fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
    kwargs = dict(reshard_after_forward=cand["sharding"] == "zero3",
                  offload_policy=CPUOffloadPolicy() if cand["offload"] else OffloadPolicy())
    if dtype:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
    wrapped = set()
    if cand["wrap"].startswith("size:"):
        # FSDP1's size policy, bottom-up: a module holding more than N
        # parameters not yet in a unit becomes one.
        limit = int(cand["wrap"].split(":")[1])

        def visit(m):
            n = sum(visit(c) for c in m.children())
            n += sum(p.numel() for p in m.parameters(recurse=False))
            if n > limit and m is not model:
                fully_shard(m, **kwargs)
                wrapped.add(m)
                return 0
            return n
        visit(model)
    elif cand["wrap"] == "block":
        for m in model.modules():
            if isinstance(m, block_class):
                fully_shard(m, **kwargs)
    fully_shard(model, **kwargs)
    return model


# ---------------------------------------------------------------------------
# one trial: build, wrap, two steps, measure
# ---------------------------------------------------------------------------

class Trial:
    def __init__(self, torch, args, device):
        self.torch, self.args, self.device = torch, args, device

    def run(self, row, batch, steps=2, history=None):
        """Returns dict(fits=True, peak_reserved, peak_allocated, step_s,
        phases) or dict(fits=False, oom=message). history: a path to write
        the caching allocator's trace of the trial to (gzip'd JSON)."""
        torch = self.torch
        try:
            return self._run(row, batch, steps, history)
        except Exception as e:  # noqa: BLE001 -- an OOM is a result; anything else is re-raised below
            oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                          getattr(torch.cuda, "OutOfMemoryError", None)) if t)
            oom = isinstance(e, oom_types) or "out of memory" in str(e)
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            if not oom:
                raise
            result = dict(fits=False, oom=msg)
        finally:
            if history:
                torch.cuda.memory._record_memory_history(enabled=None)
            gc.collect()
            torch.cuda.empty_cache()
        return result

    def _run(self, row, batch, steps, history):
        torch = self.torch
        cand = row["candidate"]
        seq_len = row.get("seq_len", self.args.seq_len)
        model, impl, loss_fn, block_class, expected = build_model(
            torch, row["model"], self.device, not self.args.minimal, row.get("attn", "eager"))
        n = count_params(model)
        if expected and n != expected:
            raise RuntimeError("%s has %d parameters, expected %d" % (row["model"], n, expected))
        if cand["offload"]:
            model = model.to("cpu")  # FSDP moves each unit to the GPU to shard it, then offloads
            torch.cuda.empty_cache()
        model, api = wrap(torch, model, cand, block_class, self.device, row.get("fsdp", 1), row.get("reduce"))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=5e-5, weight_decay=0.0)  # the write-up's optimizer
        amp = cand["sharding"] == "ddp" and cand["precision"] != "fp32"
        amp_dtype = torch.float16 if cand["precision"] == "fp16" else torch.bfloat16
        scaler = torch.amp.GradScaler("cuda") if amp and cand["precision"] == "fp16" else None
        x = torch.randint(0, vocab_of(row["model"]), (batch, seq_len), device=self.device)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        if history:
            # Every alloc/free with its size and the Python frames that made it.
            torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        step_s, phases = [], []
        allocated = functools.partial(torch.cuda.memory_allocated, self.device)
        for _ in range(steps):
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            at = dict(start=allocated())
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
                loss = loss_fn(model, x)
            at["forward"] = allocated()
            if scaler:
                scaler.scale(loss).backward()
                at["backward"] = allocated()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                at["backward"] = allocated()
                opt.step()
            at["optimizer"] = allocated()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize(self.device)
            step_s.append(time.perf_counter() - t0)
            at["peak_so_far"] = torch.cuda.max_memory_allocated(self.device)
            phases.append(at)
        stats = torch.cuda.memory_stats(self.device)
        result = dict(fits=True, peak_reserved=torch.cuda.max_memory_reserved(self.device),
                      peak_allocated=torch.cuda.max_memory_allocated(self.device),
                      num_alloc_retries=stats.get("num_alloc_retries", 0),
                      step_s=step_s, phases=phases, impl=impl, api=api)
        if history:
            write_history(torch.cuda.memory._snapshot(), history)
        del model, opt, params, x, loss
        return result


def write_history(snapshot, path):
    """The snapshot's device trace, compacted: per event its action, size,
    stream and the innermost frames outside torch's own Python (which op of
    the model made it), gzip'd JSON."""
    import gzip

    def frames(ev):
        out = []
        for f in ev.get("frames", []):
            name = f.get("filename", "")
            if "/torch/" in name and "/nn/modules/" not in name and "/distributed/" not in name:
                continue
            out.append("%s:%s:%s" % (os.path.basename(name), f.get("line"), f.get("name")))
            if len(out) == 3:
                break
        return out
    events = []
    for device_trace in snapshot.get("device_traces", []):
        for ev in device_trace:
            events.append(dict(action=ev["action"], addr=ev.get("addr"), size=ev.get("size"),
                               stream=ev.get("stream"), frames=frames(ev)))
    segments = [dict(address=s["address"], total_size=s["total_size"], segment_type=s.get("segment_type"),
                     allocated_size=s.get("allocated_size")) for s in snapshot.get("segments", [])]
    with gzip.open(path, "wt") as f:
        json.dump(dict(schema="shardfit.allocator-history/1", events=events, segments=segments), f)


def search(run_trial, hint, deadline, log, tried=None, on_trial=None):
    """The largest batch that fits, starting at `hint`: up by 1, 2, 4, ...
    while it fits, down likewise while it does not, then bisect. `tried`:
    the trials already known ({batch: result}), which are not run again."""
    tried = dict(tried or {})

    def fits(b):
        if b not in tried:
            if time.time() > deadline:
                raise TimeoutError
            r = run_trial(b)  # sets r["trial_s"]
            tried[b] = r
            if on_trial:
                on_trial(b, r)
            log("  batch %d: %s (%.1f s)" % (b, "fits, peak reserved %.2f GiB" % (r["peak_reserved"] / 2**30)
                                              if r["fits"] else "OOM", r["trial_s"]))
        return tried[b]["fits"]

    lo, hi = 0, None  # lo fits (0: nothing yet), hi does not
    b, step = max(1, hint), 1
    try:
        if fits(b):
            lo = b
            while hi is None:
                if fits(lo + step):
                    lo, step = lo + step, step * 2
                else:
                    hi = lo + step
        else:
            hi = b
            while lo == 0 and hi > 1:
                c = max(1, hi - step)
                if fits(c):
                    lo = c
                else:
                    hi, step = c, step * 2
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        complete = True
    except TimeoutError:
        complete = False
    return lo, hi, tried, complete


# ---------------------------------------------------------------------------

def setup_cuda(torch, gpu_mem, cap_mode):
    """The card, context and cuBLAS first (so what is outside the allocator is
    there), then the cap. gpu_mem "card": the whole card (cap_mode card).
    Returns (device, facts about the card)."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    a = torch.randn(256, 256, device=device)
    (a @ a).sum().item()
    del a
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside = total - free - torch.cuda.memory_reserved(device)
    if gpu_mem == "card":
        cap, cap_mode = total, "card"
    else:
        cap = parse_size(gpu_mem)
    budget = cap if cap_mode == "allocator" else cap - outside
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    return device, dict(card=torch.cuda.get_device_name(device), card_total_bytes=total, cap_bytes=budget,
                        outside_allocator_bytes=outside)


def worker(args):
    """One row in this process: the search from the trials already known
    (--worker JOB: {row, tried, deadline}), each trial appended to
    JOB.results as a JSON line. A trial that leaves memory allocated behind
    it (seen after OOMs under FSDP: every later trial then ran out) ends the
    worker with exit 75 ("tainted"), and the coordinator starts a fresh one
    that carries on from the trials known."""
    job = json.load(open(args.worker))
    out = open(args.worker + ".results", "a")

    def emit(**rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def log(msg):
        print("[fsdp_reference row %s] %s" % (job["row"].get("row"), msg), flush=True)

    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        emit(error="no CUDA device")
        return 1
    r = job["row"]
    device, facts = setup_cuda(torch, r.get("gpu_mem", args.gpu_mem), args.cap_mode)
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        emit(error="no fake process group in this torch: %s" % e)
        return 1
    facts["process_group"] = "fake (torch.testing._internal.distributed.fake_pg.FakeStore)"
    emit(setup=facts)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=r["world"])
    baseline = torch.cuda.memory_allocated(device)
    trial = Trial(torch, args, device)
    r["candidate"] = parse_candidate(r["id"])

    class Tainted(Exception):
        pass

    def run_trial(b):
        t0 = time.time()
        res = trial.run(r, b)
        res["trial_s"] = round(time.time() - t0, 1)
        left = torch.cuda.memory_allocated(device) - baseline
        # Up to 64 MiB stays by design: cuBLAS keeps a workspace per thread
        # and stream (33 MiB seen for the backward thread on the H200, torch
        # 2.11). FSDP left a whole 1.6 GiB behind after every trial there.
        if left > 64 * 2**20:  # the trial's own result stands; what follows it would not
            emit(trial=b, result=res)
            emit(tainted=left, batch=b)
            raise Tainted("%d bytes still allocated after batch %d" % (left, b))
        return res

    tried = {int(b): t for b, t in job["tried"].items()}
    try:
        if r.get("search", True) is False:  # only the allocator's history at history_batch
            path = "%s-row%s-history.json.gz" % (os.path.splitext(args.out)[0], r.get("row"))
            rec = trial.run(r, r["history_batch"], history=path)
            emit(history=dict(batch=r["history_batch"], path=os.path.basename(path), result=rec))
            emit(final=dict(lo=0, hi=None, complete=False, step_s=None, history_only=True))
            return 0
        lo, hi, tried, complete = search(run_trial, r["hint"], job["deadline"], log, tried,
                                         lambda b, t: emit(trial=b, result=t))
        step_s = None
        if lo > 0:
            best = tried[lo]
            step_s = best["step_s"][1:]  # the first step creates AdamW's state
            if args.timed_steps > 0 and time.time() + 3 * best["trial_s"] < job["deadline"]:
                again = trial.run(r, lo, steps=1 + args.timed_steps)
                if again.get("fits"):
                    step_s = again["step_s"][1:]
        history = None
        hb = r.get("history_batch")
        if hb and (hb in tried and tried[hb]["fits"] or hb <= lo) and time.time() + 30 < job["deadline"]:
            history = "%s-row%s-history.json.gz" % (os.path.splitext(args.out)[0], r.get("row"))
            log("batch %d again, the allocator's history recorded into %s" % (hb, history))
            rec = trial.run(r, hb, history=history)
            emit(history=dict(batch=hb, path=os.path.basename(history), result=rec))
        emit(final=dict(lo=lo, hi=hi, complete=complete, step_s=step_s))
    except Tainted as e:
        log("a fresh worker follows: %s" % e)
        return 75
    except NotImplementedError as e:
        emit(error="no PyTorch counterpart: %s" % e)
    except Exception as e:  # noqa: BLE001 -- recorded per row; the next row still runs
        emit(error="%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else ""))
    finally:
        dist.destroy_process_group()
    return 0


def run_row(r, args, deadline, log):
    """The coordinator's side of one row: workers until one reports a final
    result or an error. Returns (entry fields, setup facts)."""
    import subprocess
    import tempfile
    tried, facts, restarts, history = {}, None, 0, None
    while True:
        fd, job_path = tempfile.mkstemp(prefix="fsdp_row%s_" % r.get("row"), suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(dict(row={k: v for k, v in r.items() if k != "candidate"}, tried=tried, deadline=deadline), f)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", job_path, "--gpu-mem", args.gpu_mem,
               "--cap-mode", args.cap_mode, "--seq-len", str(args.seq_len), "--timed-steps", str(args.timed_steps),
               "--out", args.out]
        if args.minimal:
            cmd.append("--minimal")
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=max(30, deadline - time.time() + 60)).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out"
        final, error = None, None
        if os.path.exists(job_path + ".results"):
            for line in open(job_path + ".results"):
                rec = json.loads(line)
                if "trial" in rec:
                    tried[str(rec["trial"])] = rec["result"]
                facts = rec.get("setup", facts)
                final = rec.get("final", final)
                error = rec.get("error", error)
                history = rec.get("history", history)
            os.remove(job_path + ".results")
        os.remove(job_path)
        if final is not None or error is not None:
            break
        if rc != 75 or restarts >= 8:
            error = "worker exit %s" % rc if rc != 75 else "tainted again after %d fresh workers" % restarts
            break
        restarts += 1
    entry = dict(worker_restarts=restarts)
    for k in ("fsdp", "seq_len", "attn", "gpu_mem", "reduce"):
        if k in r:
            entry[k] = r[k]
    if history:
        entry["history"] = {k: v for k, v in history.items() if k != "result"}
        entry["history"]["phases"] = history["result"].get("phases")
    if error is not None:
        entry["status"] = "error: %s" % error if not error.startswith("no PyTorch") else error
        return entry, facts
    lo, hi, complete = final["lo"], final["hi"], final["complete"]
    entry["trials"] = {b: {k: v for k, v in t.items() if k not in ("impl", "api")}
                       for b, t in sorted(tried.items(), key=lambda kv: int(kv[0]))}
    entry["max_batch"] = lo if complete else None
    if final.get("history_only"):
        entry["status"] = "history only (no search)"
        return entry, facts
    entry["status"] = "done" if complete else "partial: time budget (max >= %d%s)" % (
        lo, "" if hi is None else ", < %d" % hi)
    if lo > 0:
        best = tried[str(lo)]
        entry.update(impl=best["impl"], api=best["api"], peak_reserved_bytes=best["peak_reserved"],
                     peak_allocated_bytes=best["peak_allocated"], num_alloc_retries=best["num_alloc_retries"])
        if final["step_s"]:
            s = sorted(final["step_s"])[len(final["step_s"]) // 2]
            entry.update(step_s=round(s, 4), tokens_per_s=lo * args.seq_len / s,
                         tokens_per_s_job=lo * args.seq_len * r["world"] / s)
    return entry, facts


def cpu_check():
    """Before a card's time is spent, on a CPU with the pinned stack: every
    model builds with its config's parameter count (on the meta device), and
    one training step of each kind of row the card runs (DDP, FSDP1 size and
    block wraps, FSDP1 bf16, FSDP2 fp32 and bf16 with fp32 reduction and
    checkpointing) runs on the tiny models as rank 0 of a fake world of 2,
    moving the parameters. FSDP1's CPUOffload needs CUDA (torch 2.11): not
    checked here. Prints 'N passed, M failed'; exit 1 on a failure, 77 when
    torch or transformers is missing."""
    try:
        import torch
        import torch.distributed as dist
        import transformers  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        print("skipped: the pinned stack is not importable here (%s); scripts/install-deps makes .venv/" % e)
        return 77
    passed, failed = 0, []
    for name in MODELS:
        model, impl, _, _, expected = build_model(torch, name, "meta", True, "sdpa")
        n = count_params(model)
        if expected is None or n == expected:
            passed += 1
        else:
            failed.append("%s: %d parameters, its config says %d" % (name, n, expected))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    cases = [("gpt2-tiny", "ddp/fp32/wrap=none", 1, "eager", None),
             ("gpt2-tiny", "zero3/fp32/wrap=size:1000", 1, "eager", None),
             ("gpt2-tiny", "zero2/bf16/wrap=block", 1, "eager", None),
             ("gpt2-tiny", "zero3/fp32/wrap=block", 2, "eager", None),
             ("llama-tiny", "zero2/fp32/wrap=block", 2, "sdpa", None),
             ("llama-tiny", "zero3+ckpt/bf16/wrap=block", 2, "sdpa", "fp32")]
    for name, cid, version, attn, reduce in cases:
        label = "%s %s FSDP%d %s" % (name, cid, version, attn) if "ddp" not in cid else "%s %s" % (name, cid)
        try:
            torch.manual_seed(0)
            model, _, loss_fn, block_class, _ = build_model(torch, name, "cpu", True, attn)
            model, _ = wrap(torch, model, parse_candidate(cid), block_class, torch.device("cpu"), version, reduce)
            params = [p for p in model.parameters() if p.requires_grad]
            before = [p.detach().clone() for p in params]
            opt = torch.optim.AdamW(params, lr=1e-3)
            loss = loss_fn(model, torch.randint(0, vocab_of(name), (2, 16)))
            loss.backward()
            opt.step()
            moved = any(not torch.equal(b, p.detach()) for b, p in zip(before, params))
            if torch.isfinite(loss).item() and moved:
                passed += 1
            else:
                failed.append("%s: loss %s, parameters %s" % (label, loss.item(), "moved" if moved else "unchanged"))
        except Exception as e:  # noqa: BLE001 -- each case reports its own failure
            failed.append("%s: %s: %s" % (label, type(e).__name__, str(e).strip().splitlines()[0][:200]))
    dist.destroy_process_group()
    for f in failed:
        print("FAILED: " + f)
    print("%d passed, %d failed" % (passed, len(failed)))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-file", help="JSON list of {row, model, world, id, hint}; default: the reference scenario")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--gpu-mem", default="24GiB")
    ap.add_argument("--cap-mode", choices=("allocator", "card"), default="allocator")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--timed-steps", type=int, default=2, help="extra steps timed at the max batch")
    ap.add_argument("--jobs", type=int, default=1,
                    help="rows searched at once, each in its own process under its own cap (memory is "
                         "per process; step times then share the card)")
    ap.add_argument("--minimal", action="store_true", help="the plain-torch GPT-2 even if transformers is there")
    ap.add_argument("--out", default="fsdp_reference.json")
    ap.add_argument("--dry-run", action="store_true", help="print the rows and settings, import nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-check", action="store_true", help="check the models and the wrapping on a CPU (no card)")
    args = ap.parse_args()
    if args.cpu_check:
        return cpu_check()
    if args.worker:
        return worker(args)
    if args.jobs > 1 and args.cap_mode == "card":
        raise SystemExit("--cap-mode card measures what is outside the allocator: one row at a time (--jobs 1)")
    started = time.time()
    deadline = started + args.budget_s
    cap = parse_size(args.gpu_mem)

    if args.rows_file:
        rows = json.load(open(args.rows_file))
    else:
        rows = [dict(row=i, model=m, world=w, id=c, hint=h) for i, (m, w, c, h) in enumerate(DEFAULT_ROWS, 1)]
    for r in rows:
        r["candidate"] = parse_candidate(r["id"])
        if r["model"] not in MODELS:
            raise SystemExit("row %s: model %s: one of %s" % (r.get("row"), r["model"], ", ".join(MODELS)))
        if r.get("fsdp", 1) not in (1, 2) or r.get("attn", "eager") not in ("eager", "sdpa"):
            raise SystemExit("row %s: fsdp is 1 or 2, attn eager or sdpa" % r.get("row"))
        if r.get("gpu_mem", "card") != "card":
            parse_size(r["gpu_mem"])
    # Cheap rows first, so a short budget still covers most of the table:
    # offload rows (CPU AdamW) last, GPT-2 XL after Large.
    rows.sort(key=lambda r: (r["candidate"]["offload"], r["model"] == "gpt2-xl", r.get("row", 0)))

    def log(msg):
        print("[fsdp_reference %5.0fs] %s" % (time.time() - started, msg), flush=True)

    if args.dry_run:
        for r in rows:
            log("row %s: %s world %d %s (start at batch %d) -> %s" % (r.get("row"), r["model"], r["world"], r["id"],
                                                                     r["hint"], r["candidate"]))
        log("cap %d bytes (%s, mode %s), seq %d, budget %.0f s, %d row(s) at once" % (
            cap, args.gpu_mem, args.cap_mode, args.seq_len, args.budget_s, args.jobs))
        return 0

    import threading
    import torch
    result = dict(schema="shardfit.fsdp-reference/1", torch=torch.__version__, cuda=torch.version.cuda,
                  command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), seq_len=args.seq_len,
                  gpu_mem=args.gpu_mem, cap_mode=args.cap_mode, jobs=args.jobs, rows=[],
                  notes="rank 0 of a fake process group (no communication: tokens/s excludes it); "
                        "tokens_per_s is rank 0's, tokens_per_s_job = x world (perfect scaling); "
                        "each row in fresh processes (a worker that leaks memory after an OOM is replaced)")
    lock = threading.Lock()

    def save():
        with lock:
            json.dump(result, open(args.out, "w"), indent=1)

    if not torch.cuda.is_available():
        result["error"] = "no CUDA device"
        save()
        log("no CUDA device")
        return 1
    entries = [dict(row=r.get("row"), model=r["model"], world=r["world"], id=r["id"], start=r["hint"]) for r in rows]
    result["rows"] = entries
    queue = list(zip(rows, entries))

    def drain():
        while True:
            with lock:
                if not queue:
                    return
                r, entry = queue.pop(0)
            if time.time() > deadline:
                entry["status"] = "skipped: time budget"
                save()
                continue
            log("row %s: %s world %d %s, start at batch %d" % (r.get("row"), r["model"], r["world"], r["id"],
                                                              r["hint"]))
            fields, facts = run_row(r, args, deadline, log)
            with lock:
                entry.update(fields)
                if facts and "card" not in result:
                    if args.jobs > 1:  # other rows' processes were on the card too
                        facts.pop("outside_allocator_bytes", None)
                        facts["outside_allocator_note"] = "not measured: --jobs > 1 (rows share the card)"
                    result.update(facts)
                if entry.get("impl"):
                    result.setdefault("model_impl", entry["impl"])
            log("row %s: max batch %s (%s)" % (r.get("row"), entry.get("max_batch"), entry["status"]))
            save()

    threads = [threading.Thread(target=drain) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["elapsed_s"] = round(time.time() - started, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
