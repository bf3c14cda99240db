"""The published JSON Schemas (docs/schemas/) hold the JSON shardfit writes.

Each schema is itself valid (Draft 2020-12), and real outputs validate
against it: plans from `shardfit plan --json` (shardfit's stack on a CPU and
on a CUDA profile, PyTorch's stack from a committed trace), a sweep, a
report `shardfit run` writes, and every committed baseline report. Edited
documents (a negative peak, an unknown sharding, a missing field) do not,
so the check can fail.

Usage: schema_test.py  (SHARDFIT_BINARY: the shardfit binary)
"""
import copy
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARDFIT = os.environ.get("SHARDFIT_BINARY", os.path.join(ROOT, "build", "cli", "shardfit"))
SCHEMAS = os.path.join(ROOT, "docs", "schemas")


def load(name):
    with open(os.path.join(SCHEMAS, name)) as f:
        return json.load(f)


PLAN, SWEEP, REPORT = load("plan.schema.json"), load("plan-sweep.schema.json"), load("report.schema.json")
HISTORY = load("allocator-history.schema.json")
# The sweep's plans refer to the plan schema by its $id.
REGISTRY = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in (PLAN, SWEEP, REPORT)])


def validator(schema):
    return Draft202012Validator(schema, registry=REGISTRY)


def shardfit(*args):
    out = subprocess.run([SHARDFIT, *args, "--log-level", "warn"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError("shardfit %s: exit %d: %s" % (" ".join(args), out.returncode, out.stderr))
    return out.stdout


class SchemaTest(unittest.TestCase):
    def test_schemas_are_valid_and_name_the_documents_they_hold(self):
        for schema, tag in ((PLAN, "shardfit.plan/1"), (SWEEP, "shardfit.plan-sweep/1"), (REPORT, "shardfit.report/1"),
                            (HISTORY, "shardfit.allocator-history/1")):
            Draft202012Validator.check_schema(schema)
            self.assertEqual(schema["title"], tag)
            self.assertEqual(schema["properties"]["schema"]["const"], tag)

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        # A committed trace (gzip: plan reads plain JSON).
        self.trace = os.path.join(self.tmp.name, "gpt2-large-hf2022.trace.json")
        with gzip.open(os.path.join(ROOT, "pytorch", "traces", "torch-1.13", "gpt2-large-hf2022.trace.json.gz")) as f:
            with open(self.trace, "wb") as out:
                out.write(f.read())

    def tearDown(self):
        self.tmp.cleanup()

    def test_plans_validate(self):
        tiny = ["plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "24MiB", "--precision", "fp32"]
        plans = {
            "cpu": json.loads(shardfit(*tiny, "--gpus", "2", "--json")),
            # A CUDA profile: allocator budget, reserved above allocated, oom figures.
            "cuda": json.loads(shardfit("plan", "--model", "gpt2", "--device", "a100-40gb", "--gpus", "2",
                                        "--strategies", "zero3/bf16/wrap=block,ddp/fp32/wrap=none", "--json")),
            # PyTorch's stack: pytorch_job, each candidate's AdamW step and rank timelines.
            "pytorch": json.loads(shardfit("plan", "--trace", self.trace, "--stack", "pytorch", "--torch", "1.13", "--device", "titan-rtx-24gb",
                                           "--gpus", "2", "--strategies", "ddp/fp32/wrap=none", "--json")),
        }
        self.assertIn("allocator_budget_bytes", plans["cuda"]["hardware"])
        self.assertIn("pytorch_job", plans["pytorch"])
        for name, plan in plans.items():
            with self.subTest(plan=name):
                validator(PLAN).validate(plan)
        sweep = json.loads(shardfit(*tiny, "--seq-len", "32,64", "--json"))
        validator(SWEEP).validate(sweep)
        self.assertEqual(len(sweep["plans"]), 2)

    def test_edited_plans_do_not(self):
        plan = json.loads(shardfit("plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "24MiB",
                                   "--precision", "fp32", "--strategies", "ddp", "--json"))
        edits = [
            lambda p: p["candidates"][0]["predicted"].__setitem__("peak_reserved_bytes", -1),
            lambda p: p["candidates"][0].__setitem__("sharding", "zero4"),
            lambda p: p["candidates"][0]["predicted"]["breakdown_bytes"].pop("grads"),
            lambda p: p["candidates"][0]["predicted"]["breakdown_bytes"].__setitem__("gradz", 1),
            lambda p: p.__setitem__("schema", "shardfit.plan/2"),
            lambda p: p["hardware"].__setitem__("gpus_per_node", 0),
            lambda p: p.pop("chosen"),
        ]
        for i, edit in enumerate(edits):
            with self.subTest(edit=i):
                bad = copy.deepcopy(plan)
                edit(bad)
                with self.assertRaises(ValidationError):
                    validator(PLAN).validate(bad)

    def test_reports_validate(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            shardfit("run", "--model", "gpt2-tiny", "--seq-len", "16", "--steps", "2", "--out", out)
            with open(out) as f:
                report = json.load(f)
        validator(REPORT).validate(report)
        baselines = sorted(glob.glob(os.path.join(ROOT, "reports", "baselines", "*.json")))
        self.assertGreater(len(baselines), 100)
        for path in baselines:
            with open(path) as f:
                doc = json.load(f)
            with self.subTest(report=os.path.basename(path)):
                validator(REPORT).validate(doc)
        bad = copy.deepcopy(report)
        bad["ranks"][0]["measured"]["peak_allocated_bytes"] = -5
        with self.assertRaises(ValidationError):
            validator(REPORT).validate(bad)
        bad = copy.deepcopy(report)
        bad["run"]["backend"] = "mpi"
        with self.assertRaises(ValidationError):
            validator(REPORT).validate(bad)

    def test_allocator_histories_validate(self):
        paths = sorted(glob.glob(os.path.join(ROOT, "reports", "gpu", "history", "*.json.gz")))
        self.assertGreaterEqual(len(paths), 4)
        for path in paths:
            with gzip.open(path, "rt") as f:
                doc = json.load(f)
            with self.subTest(history=os.path.basename(path)):
                validator(HISTORY).validate(doc)
        # What `run --allocator-history` adds: the phase, and the start state.
        doc["events"][0]["after"] = "step1/forward/transformer.h.0"
        doc["start_segments"] = [dict(doc["segments"][0], stream=0,
                                      blocks=[dict(size=doc["segments"][0]["total_size"], allocated=False)])]
        validator(HISTORY).validate(doc)
        for edit in (lambda d: d["events"][0].update(action="teleport"),
                     lambda d: d["events"][1].update(size=-1),
                     lambda d: d["start_segments"][0].pop("blocks"),
                     lambda d: d["segments"][0].update(segment_type="medium")):
            bad = copy.deepcopy(doc)
            edit(bad)
            with self.assertRaises(ValidationError):
                validator(HISTORY).validate(bad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
