"""The shardfit meter inside a real PyTorch process (pytorch/shardfit_meter.py):
what it counts is what PyTorch's CPU storages ask for, byte for byte."""
import os
import subprocess
import sys
import unittest

from torch_required import ROOT  # noqa: E402 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
import shardfit_meter  # noqa: E402

METER = shardfit_meter.Meter()


class MeterTest(unittest.TestCase):
    def setUp(self):
        METER.set_budget(0)
        METER.reset_peak()

    def test_counts_the_bytes_each_storage_asks_for(self):
        base = METER.allocated
        a = torch.empty(1000)                      # 4000 bytes
        b = torch.empty(3, 5, dtype=torch.bfloat16)  # 30 bytes
        self.assertEqual(METER.allocated - base, 4030)
        del a
        self.assertEqual(METER.allocated - base, 30)
        self.assertEqual(METER.peak - base, 4030)
        del b
        self.assertEqual(METER.allocated, base)

    def test_views_allocate_nothing_and_ops_their_outputs(self):
        x = torch.ones(16, 8)
        base = METER.allocated
        v = x.t()[2:5]
        self.assertEqual(METER.allocated, base)
        y = x @ x.t()  # a 16 x 16 fp32 output
        self.assertEqual(METER.allocated - base, 16 * 16 * 4)
        del v, y

    def test_timeline_points_carry_live_and_peak_since_the_point_before(self):
        base = METER.allocated
        a = torch.empty(100)
        del a
        METER.mark("one")
        b = torch.empty(10)
        METER.mark("two")
        t = METER.timeline()
        self.assertEqual([p["phase"] for p in t], ["one", "two"])
        self.assertEqual(t[0]["allocated_bytes"] - base, 0)
        self.assertEqual(t[0]["peak_allocated_bytes"] - base, 400)
        self.assertEqual(t[1]["allocated_bytes"] - base, 40)
        self.assertEqual(t[1]["peak_allocated_bytes"] - base, 40)
        del b

    def test_a_budget_turns_an_allocation_past_it_into_pytorchs_oom(self):
        METER.set_budget(METER.allocated + 1000)
        with self.assertRaisesRegex(RuntimeError, "out of memory"):
            torch.empty(1000)
        torch.empty(100)  # 400 bytes: under the budget
        METER.set_budget(0)

    def test_a_watch_settles_once_what_was_made_is_freed_on_another_thread(self):
        # As Gloo's worker thread holds a collective's input clone after
        # wait(): what the watched thread made is dropped by a thread later.
        import threading
        import time
        base = METER.allocated
        dropped = []
        settle = METER.watch()
        held = [torch.empty(1000)]  # 4000 bytes, made on this thread

        def worker():
            time.sleep(0.2)
            dropped.append(METER.allocated - base)
            held.clear()
        threading.Thread(target=worker).start()
        self.assertEqual(settle(10.0), (True, False))  # live when called, freed in time
        self.assertEqual(dropped, [4000])              # the worker still held it when it ran
        self.assertEqual(METER.allocated, base)        # and settle returned after the free

    def test_a_watch_of_nothing_live_does_not_wait_and_one_past_its_timeout_says_so(self):
        settle = METER.watch()
        freed = torch.empty(10)
        del freed
        self.assertEqual(settle(10.0), (False, False))
        settle = METER.watch()
        kept = torch.empty(10)
        self.assertEqual(settle(0.05), (True, True))
        before = METER.allocated
        del kept
        self.assertEqual(METER.allocated, before - 40)

    def test_a_real_ddp_job_is_measured_on_every_rank(self):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "pytorch", "validate.py"),
                              "--wrap", "ddp", "--steps", "2", "--port", "29561"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        import json
        job = json.loads(out.stdout)
        self.assertEqual([r["rank"] for r in job["ranks"]], [0, 1])
        params = 141056 * 4  # gpt2-tiny's fp32 parameters
        for r in job["ranks"]:
            init = r["timeline"][0]
            self.assertEqual(init["phase"], "init")
            # the model and DDP's gradient bucket (as large as the model: one bucket) at least
            self.assertGreaterEqual(init["allocated_bytes"], 2 * params)
            self.assertGreater(r["peak_allocated_bytes"], init["allocated_bytes"])


if __name__ == "__main__":
    unittest.main()
