"""transformers' sdpa traced for CUDA (pytorch/cuda_attention.py) against
what the H200 recorded under torch 2.11: reports/gpu/history/*-row<R>.json.gz
hold every allocation of two steps of a scripts/gpu-check row
(scripts/fsdp_reference.py, its "history_batch"). For each sdpa row with a
recording, one layer of that row's model with its attention shape is traced
with --target cuda --param-dtype bf16, and what the trace's cuDNN attention
ops allocate, forward and backward, in order, must be a run of the card's
allocations: the same sizes, one after another, in every layer the card
ran. What cuDNN's imitation does not cover is refused in one line."""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

from torch_required import ROOT  # noqa: E402 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402

RECORDER = os.path.join(ROOT, "pytorch", "trace_recorder.py")
SHARDFIT = os.environ.get("SHARDFIT_BINARY", os.path.join(ROOT, "build", "cli", "shardfit"))
HISTORIES = os.path.join(ROOT, "reports", "gpu", "history")
FORWARD, BACKWARD = "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward"
# The card's attention shape (scripts/fsdp_models.py's llama-3.2-1b), one
# layer and a small vocabulary and MLP: what the attention allocates
# depends on batch, heads, sequence and head dimension only.
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048, num_hidden_layers=1,
             num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=256, vocab_size=512,
             max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
             attn_implementation="sdpa")
# scripts/fsdp_models.py's gpt2-large attention (20 heads of 64, attention
# dropout 0.1), one layer.
GPT2_LARGE = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=1280, n_layer=1, n_head=20,
                  n_positions=1024, vocab_size=512, use_cache=False, attn_implementation="sdpa")
# The sdpa rows of scripts/gpu-check's PT_ROWS: the model, the sequence, the
# history's batch, the layers, and the forwards per layer and step (2 under
# activation checkpointing: the forward and its recompute). Two steps each.
SDPA_ROWS = {
    11: dict(config=LLAMA, seq_len=4096, batch=1, layers=16, forwards=2),
    16: dict(config=GPT2_LARGE, seq_len=128, batch=2, layers=36, forwards=1),
}


def recordings(row):
    """The card's recordings of `row`, oldest first."""
    suffix = "-row%d.json.gz" % row
    return sorted(os.path.join(HISTORIES, f) for f in os.listdir(HISTORIES) if f.endswith(suffix))


def runs(sequence, within):
    """How many times `sequence` occurs as consecutive items of `within`."""
    n = len(sequence)
    return sum(within[i:i + n] == sequence for i in range(len(within) - n + 1))


@unittest.skipIf(torch.__version__.startswith("1."), "the pinned stack's transformers needs torch 2.x")
class CudaAttentionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    def record(self, config, *args):
        path = os.path.join(self.tmp.name, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        out_path = os.path.join(self.tmp.name, "llama.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", path, "--target", "cuda",
                              "--out", out_path] + list(args), capture_output=True, text=True, timeout=600)
        return out, out_path

    def cudnn_allocations(self, row):
        """What the trace of `row`'s model makes in cuDNN's forward and
        backward ops, in order."""
        spec = SDPA_ROWS[row]
        out, path = self.record(spec["config"], "--seq-len", str(spec["seq_len"]), "--param-dtype", "bf16")
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertIn("no fp32 traces: attn_implementation sdpa in fp32 on CUDA runs the memory-efficient kernel",
                      out.stderr)
        with open(path) as f:
            file = json.load(f)
        self.assertNotIn("fp32", {t["dtype"] for t in file["traces"]})
        # The model cast to bf16 (FSDP2's MixedPrecisionPolicy), the
        # history's batch, no .grad at the start: as the card's step ran.
        trace = next(t for t in file["traces"] if t["dtype"] == "bf16" and not t.get("autocast") and
                     t["batch"] == spec["batch"] and t["grads"] == "none" and not t.get("recompute"))
        # The kernel's products, counted as FlashAttention-2's (planner/trace_recorder.cc): QK^T and PV
        # forward, five backward, half the rows under the causal mask.
        cfg, b, s = spec["config"], spec["batch"], spec["seq_len"]
        heads = cfg.get("num_attention_heads") or cfg["n_head"]
        dim = cfg.get("head_dim") or cfg["n_embd"] // cfg["n_head"]
        self.assertIn([2 * b * heads, (s + 1) // 2, s, dim], trace["work"]["forward"]["gemms"])
        self.assertIn([5 * b * heads, (s + 1) // 2, s, dim], trace["work"]["backward"]["gemms"])
        # Each op's tensors are made by its meta kernel's own empty/zeros
        # calls, then the op frees its workspace: the allocations in a row
        # before that free are the op's.
        names = trace["op_names"]
        made, run = {FORWARD: [], BACKWARD: []}, []
        for kind, _, _, _, size, op in trace["events"]:
            if kind == "alloc":
                run.append(size)
                continue
            if kind == "free" and op >= 0 and names[op] in made and not made[names[op]]:
                made[names[op]] = run
            run = []
        return made[FORWARD], made[BACKWARD]

    def test_cudnn_attention_allocates_what_the_card_recorded(self):
        checked = 0
        for row, spec in sorted(SDPA_ROWS.items()):
            paths = recordings(row)
            if not paths:  # scripts/gpu-check records it on the next card run
                print("cuda_attention_test: row %d: no recording under %s yet" % (row, HISTORIES), file=sys.stderr)
                continue
            forward, backward = self.cudnn_allocations(row)
            # seed, offset, output, log-sum-exp, workspace; dq, dk, dv, workspace.
            self.assertEqual(len(forward), 5, forward)
            self.assertEqual(len(backward), 4, backward)
            for path in paths:
                with self.subTest(recording=os.path.basename(path)):
                    with gzip.open(path, "rt") as f:
                        card = [e["size"] for e in json.load(f)["events"] if e["action"] == "alloc"]
                    # Every layer, two steps: each layer's forward (and its
                    # recompute under checkpointing) and its backward.
                    self.assertEqual(runs(forward, card), spec["layers"] * 2 * spec["forwards"],
                                     "the trace's cuDNN forward allocates %s" % forward)
                    self.assertEqual(runs(backward, card), spec["layers"] * 2,
                                     "the trace's cuDNN backward allocates %s" % backward)
                    checked += 1
        # The Llama row's recording (2026-12-04) is the one there must be.
        self.assertGreaterEqual(checked, 1)

    def test_a_trace_without_fp32_plans_its_bf16_candidates_and_refuses_fp32_ones(self):
        out, path = self.record(LLAMA, "--seq-len", "256", "--param-dtype", "bf16")
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])

        def plan(strategy):
            return subprocess.run([SHARDFIT, "plan", "--trace", path, "--stack", "pytorch", "--device",
                                   "h100-80gb", "--gpus", "2", "--fsdp-version", "2", "--strategies", strategy,
                                   "--json"], capture_output=True, text=True, timeout=600)
        done = plan("zero3/bf16/wrap=block")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertGreater(json.loads(done.stdout)["candidates"][0]["max_batch_per_gpu"], 0)
        for strategy in ("zero3/fp32/wrap=block", "ddp/fp32/wrap=none"):
            refused = plan(strategy)
            self.assertEqual(refused.returncode, 2, refused.stderr)
            self.assertEqual(refused.stderr.strip().splitlines(),
                             ["shardfit plan: error: --strategies %s: the trace file has no fp32 traces (the recorder "
                              "makes none where the target's fp32 kernels are not imitated: transformers' sdpa on "
                              "CUDA); its bf16 and fp16 candidates plan" % strategy])

    def test_what_cudnn_does_not_take_is_refused_in_one_line(self):
        # Head dimension 160: not the cuDNN attention this imitation covers.
        config = dict(LLAMA, hidden_size=320, num_attention_heads=2, num_key_value_heads=1, head_dim=160)
        out, _ = self.record(config, "--seq-len", "64", "--param-dtype", "bf16")
        self.assertEqual(out.returncode, 2, out.stderr)
        lines = out.stderr.strip().splitlines()
        self.assertIn("scaled_dot_product_attention with head dimensions [160] on CUDA", lines[-1])
        self.assertEqual(sum(line.startswith("trace_recorder:") for line in lines), 1, out.stderr)


if __name__ == "__main__":
    unittest.main()
