"""pytorch/validate.py's harness around the real jobs: launch(), which runs
the ranks and takes the job down when one fails, and
Settled, which returns from a synchronous collective only once the process
group's worker thread has let go of what the call made or was given."""
import os
import sys
import tempfile
import threading
import time
import unittest

from torch_required import ROOT  # noqa: F401 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
import validate  # noqa: E402 (pytorch/validate.py)


def wait_for(path, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def oom_then_a_peer_fails(rank, flag, queue):
    """Rank 1 runs out of memory and reports; rank 0, its peer, fails in its
    collective as rank 1's connections close, and is the first to exit."""
    if rank == 1:
        queue.put({"rank": 1, "oom": "out of memory (budget)", "peak_allocated_bytes": 0})
        open(flag, "w").close()
        time.sleep(60)  # ended by launch() once rank 0 has failed
        sys.exit(3)
    wait_for(flag)
    raise RuntimeError("[gloo] Connection closed by peer")


def fails_without_a_report(rank, flag, queue):
    """Rank 0 fails before it reports; rank 1 would wait for it forever."""
    if rank == 0:
        raise RuntimeError("a bug in the job")
    time.sleep(60)


class LaunchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = validate.rank_context(preload=())

    def test_a_rank_out_of_memory_is_the_result_when_its_peer_fails_first(self):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            reported = validate.launch(oom_then_a_peer_fails, os.path.join(tmp, "reported"), 2, self.ctx)
            self.assertEqual([r["rank"] for r in reported], [1])
            self.assertIn("oom", reported[0])
            self.assertLess(time.monotonic() - started, 50, "rank 1 was not ended when rank 0 failed")

    def test_a_rank_that_fails_before_it_reports_is_named(self):
        started = time.monotonic()
        with self.assertRaises(SystemExit) as e:
            validate.launch(fails_without_a_report, None, 2, self.ctx)
        self.assertIn("rank0 exited with code 1 before it reported", str(e.exception))
        self.assertLess(time.monotonic() - started, 50, "rank 1 was not ended when rank 0 failed")


class SettledTest(unittest.TestCase):
    @staticmethod
    def collective(hold_s):
        """A stand-in for Gloo's synchronous all-gather: it fills the output
        and returns, while a worker thread keeps a view of the output (as
        Gloo's work object does) for `hold_s` more seconds."""
        def call(output_tensor, input_tensor, async_op=False):
            view = output_tensor.view(-1)[:1]
            output_tensor.fill_(1.0)

            def worker(held=[view]):
                time.sleep(hold_s)
                held.clear()
            call.worker = threading.Thread(target=worker)
            call.worker.start()
            del view
        return call

    def settled(self, fake, timeout_s=10.0):
        return validate.Settled(fake, validate.views_of_arguments(torch), timeout_s)

    def test_returns_once_the_worker_has_let_go(self):
        fake = self.collective(0.2)
        settled = self.settled(fake)
        out, inp = torch.zeros(8), torch.zeros(2)
        settled(out, inp)
        self.assertFalse(fake.worker.is_alive(), "returned while the worker still held the output")
        self.assertEqual((settled.waited, settled.unsettled), (1, 0))
        self.assertEqual(out.sum().item(), 8.0)

    def test_a_call_whose_worker_has_let_go_does_not_count_as_waited(self):
        fake = self.collective(0.0)
        settled = self.settled(fake)
        out, inp = torch.zeros(8), torch.zeros(2)

        def collective(output_tensor, input_tensor):
            fake(output_tensor, input_tensor)
            fake.worker.join()
        settled.collective = collective
        settled(out, inp)
        self.assertEqual((settled.waited, settled.unsettled), (0, 0))

    def test_counts_a_call_whose_worker_holds_on_past_the_timeout(self):
        fake = self.collective(2.0)
        settled = self.settled(fake, timeout_s=0.1)
        settled(torch.zeros(8), torch.zeros(2))
        self.assertTrue(fake.worker.is_alive())
        self.assertEqual((settled.waited, settled.unsettled), (1, 1))
        fake.worker.join()

    def test_an_asynchronous_call_is_passed_through(self):
        fake = self.collective(0.5)
        settled = self.settled(fake)
        started = time.monotonic()
        settled(torch.zeros(8), torch.zeros(2), async_op=True)
        self.assertTrue(fake.worker.is_alive(), "an async_op call waited for the worker")
        self.assertLess(time.monotonic() - started, 0.5)
        self.assertEqual((settled.waited, settled.unsettled), (0, 0))
        fake.worker.join()


if __name__ == "__main__":
    unittest.main()
