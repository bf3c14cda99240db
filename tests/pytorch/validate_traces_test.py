"""scripts/pytorch-validate --trace-dir: the traces it keeps for reuse are
only those this tree can reuse. A trace's name carries the digest of the
stack it was recorded from (pytorch/'s sources, the tracer library, torch's
and transformers' versions); a run removes every other from the folder, and
leaves alone what is not a finished trace."""
import importlib.machinery
import importlib.util
import os
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_loader = importlib.machinery.SourceFileLoader("pytorch_validate", os.path.join(ROOT, "scripts", "pytorch-validate"))
_spec = importlib.util.spec_from_loader("pytorch_validate", _loader)
pytorch_validate = importlib.util.module_from_spec(_spec)
_loader.exec_module(pytorch_validate)


class PruneTracesTest(unittest.TestCase):
    def test_only_this_stacks_traces_and_what_is_not_a_trace_stay(self):
        stack = "abcd1234"
        kept = ["gpt2-tiny-64-%s-0123456789abcdef.trace.json" % stack,
                "hf-LlamaForCausalLM-8-%s-fedcba9876543210.trace.json" % stack,
                "gpt2-tiny-64-ffff0000-0123456789abcdef.trace.json.4242.partial",  # being written
                "notes.txt"]
        removed = ["gpt2-tiny-64-ffff0000-0123456789abcdef.trace.json",  # another stack's
                   "bert-tiny-64-1811df6102c6e7ad.trace.json"]  # named before the digest was in the name
        with tempfile.TemporaryDirectory() as folder:
            for name in kept + removed:
                open(os.path.join(folder, name), "w").close()
            pytorch_validate.prune_traces(folder, stack)
            self.assertEqual(sorted(os.listdir(folder)), sorted(kept))


if __name__ == "__main__":
    unittest.main()
