"""What the trace tests share: a trace's peak replayed from its events, and
each traced batch held against the same step on the CPU, measured by the
meter (tests/pytorch/trace_test.py, hf_trace_test.py)."""
import contextlib
import gc
import json
import os
import subprocess
import sys

from torch_required import ROOT  # noqa: E402 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
import models  # noqa: E402
import shardfit_meter  # noqa: E402

SHARDFIT = os.environ.get("SHARDFIT_BINARY", os.path.join(ROOT, "build", "cli", "shardfit"))
RECORDER = os.path.join(ROOT, "pytorch", "trace_recorder.py")


def record(tmp, model):
    """Traces a built-in at sequence 64 into folder `tmp`: (the file's path, its JSON)."""
    path = os.path.join(tmp, model + ".trace.json")
    out = subprocess.run([sys.executable, RECORDER, "--model", model, "--seq-len", "64", "--out", path],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    with open(path) as f:
        return path, json.load(f)


def replay_peak(events):
    live, peak, sizes = 0, 0, {}
    for kind, _phase, _module, tensor, nbytes, _op in events:
        if kind == "alloc":
            sizes[tensor] = nbytes
            live += nbytes
            peak = max(peak, live)
        elif kind == "free":
            live -= sizes.pop(tensor)
    return peak, live


def fresh_model(name, build=None):
    """The model the trace was recorded from, seeded as the recorder seeds it, in train mode:
    `build()`, or the built-in `name`."""
    torch.manual_seed(0)
    model = build() if build else models.build(name)
    model.train()
    return model


def step_inputs(name, batch, inputs=None):
    """The forward's inputs at `batch` x 64: `inputs(batch, 64, "cpu")`, or the built-in's tokens."""
    return (inputs or (lambda *a: (models.token_input(models.vocab_size(name))(*a),)))(batch, 64, "cpu")


def loss_of(out):
    """The loss a forward returned: first of a tuple, a Hugging Face output's .loss, or itself."""
    return out[0] if isinstance(out, tuple) else getattr(out, "loss", out)


class TraceCheck:
    """A unittest.TestCase mixin."""

    def check_every_batch(self, name, file, build=None, inputs=None):
        # The same model on the CPU, one forward + loss + backward with the
        # gradients in place or none, its blocks checkpointed or not, its
        # forward under torch.autocast("cpu", torch.bfloat16) or not, or the
        # model cast to bf16 (as each trace says), measured by the meter.
        import validate
        meter = shardfit_meter.Meter()
        params = file["model"]["params"] * 4  # fp32 gradients; a cast model's are half
        for t in file["traces"]:
            model = fresh_model(name, build)
            if t["dtype"] == "bf16" and not t.get("autocast"):
                model.to(torch.bfloat16)  # --param-dtype bf16's traces
            if t["recompute"]:
                validate.checkpoint_blocks(torch, model, reentrant=t.get("checkpoint") == "reentrant")
            for p in model.parameters():
                p.grad = torch.zeros_like(p) if t["grads"] == "accumulate" else None
            meter.reset_peak()
            base = meter.allocated
            x = step_inputs(name, t["batch"], inputs)
            with (torch.autocast("cpu", dtype=torch.bfloat16) if t.get("autocast") else contextlib.nullcontext()):
                out = model(*x)
            loss = loss_of(out)
            loss.backward()
            del out, loss, x
            peak, left = replay_peak(t["events"])
            cast = t["dtype"] == "bf16" and not t.get("autocast")
            kept = 0 if t["grads"] == "accumulate" else params // (2 if cast else 1)  # AccumulateGrad kept each op's gradient
            # What the forward returned beside the loss (its frees left out of the trace; dropped here)
            sizes = {e[3]: e[4] for e in t["events"] if e[0] == "alloc"}
            left -= sum(sizes[i] for i in t.get("kept_outputs", []))
            self.assertEqual(left, kept)
            self.assertEqual(meter.allocated - base, kept)
            self.assertEqual(peak, meter.peak - base,
                             "%s: batch %d, grads %s, recompute %s, autocast %s"
                             % (name, t["batch"], t["grads"], t["recompute"], t.get("autocast")))
            del model  # a checkpointed model is a reference cycle (forward -> bound method -> module)
            gc.collect()

    def check_work_is_the_steps_own(self, name, file, build=None, inputs=None):
        # The work the time model charges is what the step runs without the
        # tracer: the backward's nodes are the loss's autograd graph of the
        # same model (each batch traced without recompute), and the
        # tracer's module boundaries are in neither phase's kernels.
        for t in file["traces"]:
            for phase in ("forward", "backward"):
                self.assertNotIn("ShardfitModuleBoundary", [k[0] for k in t["work"][phase]["kernels"]])
            if t["recompute"] or t["dtype"] != "fp32":
                continue
            loss = loss_of(fresh_model(name, build)(*step_inputs(name, t["batch"], inputs)))
            seen, stack = set(), [loss.grad_fn]
            while stack:
                node = stack.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                stack.extend(f for f, _ in node.next_functions)
            self.assertEqual(t["work"]["backward"]["nodes"], len(seen), "%s: batch %d" % (name, t["batch"]))
