"""What PyTorch's AdamW step costs to dispatch and what FSDP's hooks cost
(pytorch/calibrate_stack.py, `shardfit calibrate --stack pytorch`), and
which of its lines a `--stack pytorch` plan charges: FSDP2's DTensors the
DTensor line, DDP's parameters and FSDP1's flat parameters the plain one,
each at the tensors its optimizer steps; FSDP1's and FSDP2's forward and
backward their version's hook line at their units and parameters, DDP's
its gradient mode's line at its buckets and parameters. The
figures themselves depend on the machine and its load; what is checked is
that each was measured, and where each is used."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from torch_required import ROOT  # noqa: E402 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
from trace_check import RECORDER, SHARDFIT  # noqa: E402

PROBE = os.path.join(ROOT, "pytorch", "calibrate_stack.py")
PARTS = ("fixed_s", "per_tensor_s", "per_shape_s")
HOOK_PARTS = ("fixed_s", "per_group_s", "per_param_s")
DDP_PARTS = ("fixed_s", "per_bucket_s", "per_param_s")


class OptimizerDispatchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def test_the_probe_measures_each_step_over_tensors_and_dtensors(self):
        out = subprocess.run([sys.executable, PROBE, "--threads", "1", "--out", self.path("adamw.json")],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        with open(self.path("adamw.json")) as f:
            probe = json.load(f)
        self.assertEqual(probe["torch"], torch.__version__.split("+")[0])
        for step in ("for-loop", "foreach", "fused"):
            for kind in ("tensor", "dtensor"):
                line = probe["adamw_steps"][step][kind]
                self.assertGreaterEqual(line["fixed_s"], 0, (step, kind))
                self.assertGreater(line["per_tensor_s"], 0, (step, kind))
                self.assertGreaterEqual(line["per_shape_s"], 0, (step, kind))
        for table in ("fsdp1_hooks", "fsdp2_hooks"):
            for sharding in ("zero3", "zero2"):
                for phase in ("forward", "backward"):
                    line = probe[table][sharding][phase]
                    self.assertEqual(sorted(line), sorted(HOOK_PARTS), (table, sharding, phase))
                    # Every unit all-gathers (and in backward reduce-scatters) on 2 ranks.
                    self.assertGreater(line["per_group_s"], 0, (table, sharding, phase))
                    self.assertTrue(all(v >= 0 for v in line.values()), (table, sharding, phase, line))
        for mode in ("copy", "view"):  # gradient_as_bucket_view False, True
            for phase in ("forward", "backward"):
                line = probe["ddp_hooks"][mode][phase]
                self.assertEqual(sorted(line), sorted(DDP_PARTS), (mode, phase))
                self.assertTrue(all(v >= 0 for v in line.values()), (mode, phase, line))
            # Each bucket is an all-reduce on 2 ranks.
            self.assertGreater(probe["ddp_hooks"][mode]["backward"]["per_bucket_s"], 0, mode)
        self.assertGreaterEqual(probe["ddp_buffers_s"], 0)
        self.assertGreater(probe["broadcast_s"], 0)  # ZeroRedundancyOptimizer's, from Python
        self.assertEqual(probe["not_measured"], [])  # torch 2.11 runs every step over both kinds
        for bad_args, named in ((["--threads", "0"], "--threads 0"), (["--nproc", "1"], "--nproc 1")):
            bad = subprocess.run([sys.executable, PROBE] + bad_args, capture_output=True, text=True, timeout=60)
            self.assertEqual(bad.returncode, 1)
            self.assertIn(named, bad.stderr)

    def test_a_plan_charges_fsdp2_the_dtensor_line_and_the_rest_the_plain_one(self):
        trace = self.path("gpt2-tiny.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-tiny", "--seq-len", "16", "--out", trace],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        with open(trace) as f:
            shapes = [tuple(p["shape"]) for m in json.load(f)["modules"] for p in m["params"]]
        params, distinct = len(shapes), len(set(shapes))
        # cpu.json with measured kernels (made up: one rate for every
        # product) and for-loop AdamW lines: the same fixed second for
        # both kinds in one profile; in the other a slope for each, by
        # tensor and by distinct shape.
        with open(os.path.join(ROOT, "profiles", "cpu.json")) as f:
            base = json.load(f)

        def profile(name, tensor, dtensor, hooks=None, broadcast_s=None, ddp_buffers_s=None):
            p = json.loads(json.dumps(base))
            p["measured_kernels"] = {"op_overhead_s": 2e-6, "matmul_dims": [16],
                                     "matmul_flops_per_s": {"fp32": [1e10]},
                                     "adamw_steps": {"for-loop": {
                                         "tensor": dict(zip(PARTS, tensor)), "dtensor": dict(zip(PARTS, dtensor))}}}
            for field in ("op_overhead_s", "matmul_dims", "matmul_flops_per_s.fp32"):
                p["sources"]["measured_kernels." + field] = "made up by this test"
            for kind in ("tensor", "dtensor"):
                for part in PARTS:
                    p["sources"]["measured_kernels.adamw_steps.for-loop.%s.%s" % (kind, part)] = "made up by this test"
            if broadcast_s is not None:
                p["measured_kernels"]["broadcast_s"] = broadcast_s
                p["sources"]["measured_kernels.broadcast_s"] = "made up"
            if ddp_buffers_s is not None:
                p["measured_kernels"]["ddp_buffers_s"] = ddp_buffers_s
                p["sources"]["measured_kernels.ddp_buffers_s"] = "made up"
            # {table: {sharding or mode: {phase: (fixed, a unit or bucket, a parameter)}}}
            for table, lines in (hooks or {}).items():
                parts = DDP_PARTS if table == "ddp_hooks" else HOOK_PARTS
                p["measured_kernels"][table] = {
                    s: {ph: dict(zip(parts, line)) for ph, line in phases.items()} for s, phases in lines.items()}
                for s, phases in lines.items():
                    for ph in phases:
                        for part in parts:
                            p["sources"]["measured_kernels.%s.%s.%s.%s" % (table, s, ph, part)] = "made up"
            with open(self.path(name), "w") as f:
                json.dump(p, f)
            return self.path(name)

        flat = profile("flat.json", (1.0, 0.0, 0.0), (1.0, 0.0, 0.0))
        sloped = profile("sloped.json", (1.0, 0.5, 0.125), (2.0, 0.25, 0.0625))

        def plan(device, version, strategies, part, extra=(), traced=trace):
            """{sharding: (the time_breakdown_s part, units, max batch)} of each candidate."""
            out = subprocess.run([SHARDFIT, "plan", "--trace", traced, "--stack", "pytorch", "--device", device,
                                  "--gpus", "2", "--gpu-mem", "64MiB", "--fsdp-version", version, "--json",
                                  "--strategies", strategies, *extra], capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            cands = json.loads(out.stdout)["candidates"]
            for c in cands:
                self.assertEqual(c["adamw_step"], "for-loop")  # PyTorch's default on a CPU
            return {c["id"].split("/")[0]: (c["predicted"]["time_breakdown_s"][part], c["units"],
                                            c["max_batch_per_gpu"]) for c in cands}

        def optimizer_s(device, version):
            return plan(device, version, "ddp/fp32/wrap=none,zero3/fp32/wrap=block", "optimizer")

        for version in ("1", "2"):
            a, b = optimizer_s(flat, version), optimizer_s(sloped, version)
            # DDP's AdamW steps every parameter, plain tensors of their shapes.
            self.assertAlmostEqual(b["ddp"][0] - a["ddp"][0], 0.5 * params + 0.125 * distinct, places=9)
            if version == "2":  # every parameter a DTensor
                self.assertAlmostEqual(b["zero3"][0] - a["zero3"][0], 1.0 + 0.25 * params + 0.0625 * distinct,
                                       places=9)
            else:  # one flat parameter a unit, plain: the two blocks' shards of one size, the root's another
                self.assertEqual(a["zero3"][1], 3)
                self.assertAlmostEqual(b["zero3"][0] - a["zero3"][0], 0.5 * 3 + 0.125 * 2, places=9)
            self.assertGreater(a["zero3"][0], 1.0)  # the fixed second, beside the step's bytes

        # FSDP's hooks: each phase of zero3 pays its version's zero3 line and
        # zero2 its zero2 line, at a group a unit (the 2 blocks and the root:
        # each holds parameters) and a parameter one of the model's.
        hooked = profile("hooked.json", (1.0, 0.0, 0.0), (1.0, 0.0, 0.0), {
            "fsdp2_hooks": {"zero3": {"forward": (1.0, 0.5, 0.25), "backward": (2.0, 0.125, 0.0625)},
                            "zero2": {"forward": (4.0, 0.0, 0.0), "backward": (8.0, 0.0, 0.0)}},
            "fsdp1_hooks": {"zero3": {"forward": (16.0, 0.0, 0.0), "backward": (32.0, 0.0, 0.0)},
                            "zero2": {"forward": (0.0, 2.0, 0.0), "backward": (0.0, 0.0, 1.0)}}})

        def compute_s(device, version):
            return plan(device, version, "zero3/fp32/wrap=block,zero2/fp32/wrap=block", "compute")

        for version, zero3, zero2 in (("2", 1.0 + 0.5 * 3 + 0.25 * params + 2.0 + 0.125 * 3 + 0.0625 * params, 12.0),
                                      ("1", 48.0, 2.0 * 3 + 1.0 * params)):
            a, h = compute_s(flat, version), compute_s(hooked, version)
            for sharding in ("zero3", "zero2"):
                self.assertEqual(h[sharding][1], 3)
                self.assertEqual(a[sharding][2], h[sharding][2])  # the same batch: hooks cost time, not memory
            self.assertAlmostEqual(h["zero3"][0] - a["zero3"][0], zero3, places=9)
            self.assertAlmostEqual(h["zero2"][0] - a["zero2"][0], zero2, places=9)

        # DDP's hooks (ZeroRedundancyOptimizer's DDP too): the line of its
        # gradient mode at its buckets and parameters, the forward's on
        # each micro-batch, the backward's on the one that reduces. The
        # model's fp32 parameters fill less than DDP's first bucket (1 MiB):
        # one bucket. gpt2-tiny has no buffer to broadcast.
        with open(trace) as f:
            numel = sum(torch.Size(p["shape"]).numel() for m in json.load(f)["modules"] for p in m["params"])
        self.assertLess(4 * numel, 2**20)
        ddp = profile("ddp.json", (1.0, 0.0, 0.0), (1.0, 0.0, 0.0), {
            "ddp_hooks": {"copy": {"forward": (1.0, 0.5, 0.25), "backward": (2.0, 4.0, 0.125)},
                          "view": {"forward": (8.0, 0.0, 0.0), "backward": (16.0, 0.0, 0.0)}}}, ddp_buffers_s=32.0)
        copy_s = (1.0 + 0.5 + 0.25 * params, 2.0 + 4.0 + 0.125 * params)
        for extra, forward_s, backward_s in (((), *copy_s), (("--grad-accum", "3"), 3 * copy_s[0], copy_s[1]),
                                             (("--ddp-bucket-view",), 8.0, 16.0)):
            a = plan(flat, "2", "ddp/fp32/wrap=none,zero1/fp32/wrap=none", "compute", extra)
            h = plan(ddp, "2", "ddp/fp32/wrap=none,zero1/fp32/wrap=none", "compute", extra)
            for sharding in ("ddp", "zero1"):
                self.assertEqual(a[sharding][2], h[sharding][2])  # hooks cost time, not memory
                self.assertAlmostEqual(h[sharding][0] - a[sharding][0], forward_s + backward_s, places=9,
                                       msg=(extra, sharding))
        # A model with buffers (gpt2-hf2022-tiny's attention masks): DDP
        # broadcasts them before each forward.
        buffered = self.path("gpt2-hf2022-tiny.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "16", "--out",
                              buffered], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        a = plan(flat, "2", "ddp/fp32/wrap=none", "compute", ("--grad-accum", "2"), buffered)["ddp"][0]
        b = plan(ddp, "2", "ddp/fp32/wrap=none", "compute", ("--grad-accum", "2"), buffered)["ddp"][0]
        with open(buffered) as f:
            tensors = [p["shape"] for m in json.load(f)["modules"] for p in m["params"]]
        self.assertLess(4 * sum(torch.Size(s).numel() for s in tensors), 2**20)  # one bucket
        n = len(tensors)
        self.assertAlmostEqual(b - a, 2 * (1.0 + 0.5 + 0.25 * n + 32.0) + 2.0 + 4.0 + 0.125 * n, places=9)

        # ZeroRedundancyOptimizer broadcasts each parameter after its step:
        # each pays the measured broadcast in place of the link's latency.
        latency_s = base["gpu_link"].get("latency_s", 0.0)
        broadcast = profile("broadcast.json", (1.0, 0.0, 0.0), (1.0, 0.0, 0.0), broadcast_s=1.0)
        a = plan(flat, "2", "zero1/fp32/wrap=none", "comm")["zero1"][0]
        b = plan(broadcast, "2", "zero1/fp32/wrap=none", "comm")["zero1"][0]
        self.assertAlmostEqual(b - a, params * (1.0 - latency_s), places=9)


if __name__ == "__main__":
    unittest.main()
