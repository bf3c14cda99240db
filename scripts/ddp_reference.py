#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel on CPU ranks over Gloo: the
reference `scripts/throughput` puts beside `shardfit run`'s tokens/s.

The same work as `shardfit run --model M --strategy ddp/fp32/wrap=none
--nproc N --batch B --seq-len S --steps K`: GPT-2 with Hugging Face shapes
(fsdp_reference.py's MinimalGPT2: eager attention, tanh GELU, dropout 0.1,
tied output embedding), AdamW (torch.optim.AdamW, shardfit's defaults:
lr 6e-4, weight decay 0.01), N processes on this host sharing its cores
(each torch.set_num_threads(cores // N), as shardfit's ranks do), the loss
averaged over ranks every step. tokens/s is shardfit's definition: the
whole job's tokens of steps 2..K over the time from the end of step 1 to the
end of step K.

Usage: ddp_reference.py --model gpt2|CONFIG.json --nproc 2 --batch 2 --seq-len 128 --steps 6
(CONFIG.json: a Hugging Face GPT-2 config, n_embd, n_layer, n_head,
vocab_size, n_positions; the same file `shardfit run --model` reads.)
Prints one JSON object: {"tokens_per_s", "loss", "torch", ...}.
"""
import argparse
import json
import os
import sys
import time


def worker(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fsdp_models as ref

    cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // args.nproc))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=args.nproc)
    name = args.model
    if name.endswith(".json"):  # a Hugging Face GPT-2 config.json, as `shardfit run --model FILE`
        cfg = json.load(open(name))
        ref.VOCAB, ref.POSITIONS = cfg.get("vocab_size", 50257), cfg.get("n_positions", 1024)
        ref.GPT2[name] = dict(n_embd=cfg.get("n_embd", 768), n_layer=cfg.get("n_layer", 12),
                              n_head=cfg.get("n_head", 12), params=None)
    torch.manual_seed(args.seed)
    model, impl, loss_fn, _, _ = ref.build_model(torch, name, "cpu", prefer_transformers=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=6e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + rank)
    losses, timed_from = [], None
    for step in range(1, args.steps + 1):
        x = torch.randint(0, ref.VOCAB, (args.batch, args.seq_len), generator=gen)
        loss = loss_fn(ddp, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / args.nproc)
        if step == 1:
            timed_from = time.perf_counter()
    elapsed = time.perf_counter() - timed_from
    if rank == 0:
        tokens = (args.steps - 1) * args.nproc * args.batch * args.seq_len
        queue.put({"tokens_per_s": tokens / elapsed, "loss": losses, "impl": impl,
                   "torch": torch.__version__, "threads_per_rank": torch.get_num_threads(),
                   "params": ref.count_params(model)})
    dist.barrier()
    dist.destroy_process_group()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
    import rank_exit
    rank_exit.leave()  # rank 0's figures are on the queue


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps %d: needs 2 or more (the first step is not timed)" % args.steps)
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, args.port, queue), nprocs=args.nproc, join=True,
                       start_method="spawn")
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
