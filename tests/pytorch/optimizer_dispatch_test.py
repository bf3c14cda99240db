"""What PyTorch's AdamW step costs to dispatch (pytorch/calibrate_stack.py,
`shardfit calibrate --stack pytorch`), and which of its lines a
`--stack pytorch` plan charges: FSDP2's DTensors the DTensor line, DDP's
parameters and FSDP1's flat parameters the plain one, each at the tensors
its optimizer steps. The figures themselves depend on the machine and its
load; what is checked is that each was measured, and where each is used."""
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
        bad = subprocess.run([sys.executable, PROBE, "--threads", "0"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("--threads 0", bad.stderr)

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

        def profile(name, tensor, dtensor):
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
            with open(self.path(name), "w") as f:
                json.dump(p, f)
            return self.path(name)

        flat = profile("flat.json", (1.0, 0.0, 0.0), (1.0, 0.0, 0.0))
        sloped = profile("sloped.json", (1.0, 0.5, 0.125), (2.0, 0.25, 0.0625))

        def optimizer_s(device, version):
            out = subprocess.run([SHARDFIT, "plan", "--trace", trace, "--stack", "pytorch", "--device", device,
                                  "--gpus", "2", "--gpu-mem", "64MiB", "--fsdp-version", version, "--json",
                                  "--strategies", "ddp/fp32/wrap=none,zero3/fp32/wrap=block"],
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            cands = json.loads(out.stdout)["candidates"]
            for c in cands:
                self.assertEqual(c["adamw_step"], "for-loop")  # PyTorch's default on a CPU
            return {c["id"].split("/")[0]: (c["predicted"]["time_breakdown_s"]["optimizer"], c["units"])
                    for c in cands}

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


if __name__ == "__main__":
    unittest.main()
