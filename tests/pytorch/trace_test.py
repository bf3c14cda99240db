"""A model written in Python, traced in its own process (pytorch/trace_recorder.py)
and planned with `shardfit plan --trace`: the trace is what the real CPU step
allocates, byte for byte, and bad input is one line with exit code 2."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from torch_required import ROOT  # noqa: E402 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
import models  # noqa: E402
import shardfit_meter  # noqa: E402
import trace_optimizer  # noqa: E402
from trace_check import RECORDER, SHARDFIT, TraceCheck, record, replay_peak  # noqa: E402




class TraceTest(TraceCheck, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.trace, cls.file = cls.record("gpt2-tiny")
        # 2022's Hugging Face GPT-2 (pytorch/models.py): the model with buffers.
        cls.hf_trace, cls.hf_file = cls.record("gpt2-hf2022-tiny")

    @classmethod
    def record(cls, model):
        """Traces a built-in at sequence 64: (the file's path, its JSON)."""
        return record(cls.tmp.name, model)

    def test_the_file_holds_the_module_table_and_batches_1_2_3(self):
        f = self.file
        self.assertEqual(f["schema"], "shardfit.trace/1")
        self.assertEqual(f["model"]["params"], 141056)  # gpt2-tiny's, as `shardfit models` counts it
        blocks = [i for i, m in enumerate(f["modules"]) if m["is_block"]]
        pairs = [(b, g) for g in ("accumulate", "none") for b in (1, 2, 3)]
        self.assertEqual([(t["batch"], t["grads"], t["recompute"], t.get("checkpoint"), t["dtype"], t.get("autocast"))
                          for t in f["traces"]],
                         [(b, g, [], None, "fp32", None) for b, g in pairs]
                         + [(b, g, blocks, None, "fp32", None) for b, g in pairs]
                         + [(b, g, blocks, "reentrant", "fp32", None) for b, g in pairs]
                         + [(b, g, [], None, "bf16", True) for b, g in pairs])  # the forward under autocast
        self.assertEqual(len(f["optimizer"]["per_param"]), 28)  # gpt2-tiny's parameters
        self.assertEqual(len(f["optimizer"]["steps"]), 2)
        self.assertEqual(sum(m["is_block"] for m in f["modules"]), 2)
        names = [p["name"] for m in f["modules"] for p in m["params"]]
        self.assertIn("transformer.h.1.attn.c_attn.weight", names)
        self.assertEqual(len(names), len(set(names)))

    def test_every_batch_traced_is_what_the_cpu_step_allocates(self):
        self.check_every_batch("gpt2-tiny", self.file)

    def test_the_work_timed_is_what_the_step_runs_without_the_tracer(self):
        self.check_work_is_the_steps_own("gpt2-tiny", self.file)
        self.check_work_is_the_steps_own("gpt2-hf2022-tiny", self.hf_file)

    @unittest.skipIf(torch.__version__.startswith("1."), "1.13's meta device cannot run repeat_interleave with a Python int")
    def test_gqa_by_repeat_interleave_is_traced_exactly(self):
        _, file = self.record("llama-tiny-ri")
        self.check_every_batch("llama-tiny-ri", file)

    def test_the_model_cast_to_bf16_is_traced_exactly_on_the_cpu(self):
        # --param-dtype bf16 for the CPU (FSDP2's MixedPrecisionPolicy and
        # FSDP1's MixedPrecision on CPU ranks): every cast trace is what the cast model allocates on the
        # CPU, its bf16 matmuls' oneDNN scratchpads included (for this
        # process's threads, which the recorder's default follows). GPT-2's
        # blocks take only the hidden states, so casting their inputs adds
        # nothing here.
        path = os.path.join(self.tmp.name, "gpt2-hf2022-tiny-bf16.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--param-dtype", "bf16", "--out", path], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        with open(path) as f:
            file = json.load(f)
        cast = [t for t in file["traces"] if t["dtype"] == "bf16" and not t.get("autocast")]
        self.assertEqual([(t["batch"], t["grads"]) for t in cast],
                         [(b, g) for g in ("accumulate", "none") for b in (1, 2, 3)])
        self.check_every_batch("gpt2-hf2022-tiny", dict(file, traces=cast))
        # The casts converted nothing, so the traces are FSDP1's as well.
        self.assertEqual(file["block_input_casts"], 0)
        # Planned on CPU ranks as FSDP2 by block (fully_shard casting each
        # block's inputs, as the trace does) and as FSDP1's MixedPrecision
        # by block or by size; FSDP2 on the root alone is refused there.
        def plan(*extra, trace=path):
            return subprocess.run([SHARDFIT, "plan", "--trace", trace, "--stack", "pytorch", "--device", "cpu",
                                   "--gpus", "2", "--gpu-mem", "64MiB", "--json"] + list(extra),
                                  capture_output=True, text=True, timeout=300)
        for version, strategies in (("2", "zero3/fp32/wrap=block,zero3/bf16/wrap=block"),
                                    ("1", "zero3/fp32/wrap=block,zero3/bf16/wrap=block,zero2/bf16/wrap=size:2000")):
            out = plan("--fsdp-version", version, "--fsdp-reduce-dtype", "fp32", "--strategies", strategies)
            self.assertEqual(out.returncode, 0, out.stderr)
            batch = {c["id"]: c["max_batch_per_gpu"] for c in json.loads(out.stdout)["candidates"]}
            self.assertGreater(batch["zero3/bf16/wrap=block"], batch["zero3/fp32/wrap=block"])
        out = plan("--fsdp-version", "2", "--strategies", "zero3/bf16/wrap=none")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("in bf16 by block (MixedPrecisionPolicy", out.stderr)
        # A model whose blocks take fp32 inputs (llama-tiny's rotary tables,
        # computed in fp32 and passed to each of its 2 blocks: 2 tensors x 2
        # blocks x 6 traces converted): FSDP1 would not cast them, so its
        # bf16 plan is refused, one line; so is a file that does not say.
        llama = os.path.join(self.tmp.name, "llama-tiny-bf16.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "llama-tiny", "--seq-len", "8",
                              "--param-dtype", "bf16", "--out", llama], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        with open(llama) as f:
            self.assertEqual(json.load(f)["block_input_casts"], 24)
        unsaid = os.path.join(self.tmp.name, "gpt2-hf2022-tiny-bf16-unsaid.trace.json")
        with open(unsaid, "w") as f:
            json.dump({k: v for k, v in file.items() if k != "block_input_casts"}, f)
        for trace, why in ((llama, "cast 24 floating block inputs"), (unsaid, "does not say")):
            out = plan("--fsdp-reduce-dtype", "fp32", "--strategies", "zero3/bf16/wrap=block", trace=trace)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn("FSDP1's MixedPrecision casts only the root's inputs", out.stderr)
            self.assertIn(why, out.stderr)

    def test_a_model_with_buffers_is_traced_exactly_and_its_buffers_listed(self):
        self.check_every_batch("gpt2-hf2022-tiny", self.hf_file)
        buffers = [b for m in self.hf_file["modules"] for b in m.get("buffers", [])]
        self.assertEqual([b["name"] for b in buffers],
                         ["transformer.h.%d.attn.%s" % (i, n) for i in range(2) for n in ("bias", "masked_bias")])
        self.assertEqual([(b["dtype"], b["bytes"]) for b in buffers], [("uint8", 128 * 128), ("float32", 4)] * 2)
        self.assertEqual(self.hf_file["model"]["params"], 141056)  # gpt2-tiny's shapes; the head tied
        # (loss, logits, presents): the loss, the logits and every layer's c_attn output (keys and
        # values are views of it) are what a loop holding the output keeps; under checkpointing
        # (use_cache off) the loss and the logits.
        for t in self.hf_file["traces"]:
            sizes = {e[3]: e[4] for e in t["events"] if e[0] == "alloc"}
            kept = sorted(sizes[i] for i in t.get("kept_outputs", []))
            b = t["batch"]
            if t.get("checkpoint") == "reentrant":
                # The loss, the logits, and each block's CheckpointFunction context, whose CPU RNG
                # state (ctx.fwd_cpu_state) lives as long as the graph the held logits reference.
                rng = torch.get_rng_state().numel()
                self.assertEqual(kept, sorted([4, rng, rng, b * 64 * 512 * 4]))
            elif t["recompute"]:
                self.assertEqual(kept, [4, b * 64 * 512 * 4])  # the loss and the logits
            else:
                # the loss, each layer's keys and values (views of c_attn's output) and the logits;
                # under autocast those two come out of bf16 matmuls.
                e = 2 if t.get("autocast") else 4
                self.assertEqual(kept, sorted([4] + [b * 64 * 3 * 64 * e] * 2 + [b * 64 * 512 * e]))

    def check_steps_against_the_cpu(self, steps, **implementation):
        """Each recorded step replayed: its peak and what it leaves are what
        AdamW(**implementation) allocates stepping gpt2-tiny on the CPU.
        Returns the meter and the optimizer, stepped."""
        meter = shardfit_meter.Meter()
        model = models.build("gpt2-tiny")
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt = trace_optimizer.make_optimizer(model.parameters(), **implementation)
        self.assertEqual(len(steps), 2)
        for step in steps:
            meter.reset_peak()
            base = meter.allocated
            opt.step()
            peak, left = replay_peak(step["events"])
            self.assertEqual(peak, meter.peak - base)
            self.assertEqual(left, meter.allocated - base)
        return meter, opt

    def test_the_optimizers_steps_are_what_adamw_allocates_on_the_cpu(self):
        meter, opt = self.check_steps_against_the_cpu(self.file["optimizer"]["steps"])
        # zero_grad(set_to_none=True): what it allocates itself (1.13's
        # profiler record_function holds a few hundred host bytes; 2.11's
        # nothing, and the file then has no zero_grad), then the gradients go.
        meter.reset_peak()
        base = meter.allocated
        opt.zero_grad(set_to_none=True)
        peak, left = replay_peak(self.file["optimizer"].get("zero_grad", {"events": []})["events"])
        self.assertEqual(peak, meter.peak - base)
        self.assertEqual(left - 141056 * 4, meter.allocated - base)

    def test_the_multi_tensor_steps_are_what_adamw_foreach_allocates_on_the_cpu(self):
        self.check_steps_against_the_cpu(self.file["optimizer"]["foreach_steps"], foreach=True)

    @unittest.skipIf(not trace_optimizer.has_fused(), "1.13's AdamW(fused=True) is CUDA's only: no fused steps traced")
    def test_the_fused_steps_are_what_adamw_fused_allocates_on_the_cpu(self):
        steps = self.file["optimizer"]["fused_steps"]
        self.check_steps_against_the_cpu(steps, fused=True)
        # The first step makes each parameter's state (a 4-byte step count,
        # exp_avg, exp_avg_sq); later ones keep nothing new.
        self.assertEqual(replay_peak(steps[0]["events"])[1], 28 * 4 + 2 * 141056 * 4)
        self.assertEqual(replay_peak(steps[1]["events"])[1], 0)

    def test_plan_from_the_trace_file(self):
        out = subprocess.run([SHARDFIT, "plan", "--trace", self.trace, "--device", "cpu", "--gpus", "2",
                              "--gpu-mem", "16MiB", "--json"], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        plan = json.loads(out.stdout)
        self.assertEqual(plan["model"]["name"], "gpt2-tiny")
        self.assertEqual(plan["model"]["seq_len"], 64)
        self.assertEqual(plan["model"]["params"], 141056)
        fits = [c for c in plan["candidates"] if c["max_batch_per_gpu"] > 0]
        self.assertTrue(fits)
        for c in fits:
            self.assertLessEqual(c["predicted"]["peak_allocated_bytes"], 16 * 2**20)
        out = subprocess.run([SHARDFIT, "plan", "--trace", self.trace, "--stack", "pytorch", "--device", "cpu",
                              "--gpus", "2", "--gpu-mem", "16MiB", "--json"], capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        plan = json.loads(out.stdout)
        self.assertEqual(plan["stack"], "pytorch")
        self.assertEqual(sorted(c["id"] for c in plan["candidates"]),
                         ["ddp+ckpt/fp32/wrap=none", "ddp/bf16/wrap=none", "ddp/fp32/wrap=none",
                          "zero1+ckpt/fp32/wrap=none", "zero1/bf16/wrap=none", "zero1/fp32/wrap=none"])

    def test_a_candidate_that_fits_no_batch_is_predicted_at_what_batch_1_needs(self):
        # With no memory limit at batch 1: on a CPU that many bytes fit
        # batch 1 on every rank, and a byte less does not.
        def plan(budget):
            out = subprocess.run([SHARDFIT, "plan", "--trace", self.trace, "--stack", "pytorch", "--device", "cpu",
                                  "--gpus", "2", "--gpu-mem", str(budget), "--strategies", "zero1/fp32/wrap=none",
                                  "--json"], capture_output=True, text=True, timeout=300)
            return json.loads(out.stdout)["candidates"][0]
        tight = plan(2**20)
        self.assertEqual(tight["max_batch_per_gpu"], 0)
        needs = tight["predicted"]["peak_reserved_bytes"]
        self.assertGreater(needs, 2**20)
        self.assertEqual(plan(needs)["max_batch_per_gpu"], 1)
        self.assertEqual(plan(needs - 1)["max_batch_per_gpu"], 0)

    def test_the_trace_names_its_pytorch_and_plan_follows_torchs_defaults(self):
        import torch
        self.assertEqual(self.file["torch"], torch.__version__.split("+")[0])
        base = [SHARDFIT, "plan", "--trace", self.trace, "--stack", "pytorch", "--device", "cpu", "--gpus", "2",
                "--gpu-mem", "16MiB", "--json"]
        jobs = {}
        for torch_flag in ([], ["--torch", "2.11"], ["--torch", "1.13"], ["--torch", "1.13", "--zero-grad", "none"]):
            out = subprocess.run(base + torch_flag, capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            job = json.loads(out.stdout)["pytorch_job"]
            jobs[" ".join(torch_flag)] = (job["torch"], job["zero_grad"], job["checkpoint"])
            self.assertEqual(job["loop_keeps"], "outputs")  # `outputs = model(x)`, unless --loop-keeps loss
            # Planned as a PyTorch the trace was not recorded under: said, once.
            self.assertEqual("recorded under PyTorch" in out.stderr,
                             not self.file["torch"].startswith(job["torch"] + "."), out.stderr)
        # 2.x drops the gradients, transformers checkpoints non-reentrant;
        # 1.13 zeroes them and checkpoints reentrant; an option given wins.
        self.assertEqual(jobs, {"": ("2.11", "none", "non-reentrant"),
                                "--torch 2.11": ("2.11", "none", "non-reentrant"),
                                "--torch 1.13": ("1.13", "zero", "reentrant"),
                                "--torch 1.13 --zero-grad none": ("1.13", "none", "reentrant")})
        for bad, said in ((["--torch", "1.12"], "--torch 1.12: expected 2.11"),
                          (["--torch", "2.11", "--zero-grad", "some"], "--zero-grad some: expected none")):
            out = subprocess.run(base + bad, capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn(said, out.stderr)
        out = subprocess.run([SHARDFIT, "plan", "--trace", self.trace, "--device", "cpu", "--torch", "1.13"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("--torch: whose PyTorch runs the job; give --stack pytorch", out.stderr)

    def test_gradient_accumulation_is_per_micro_batch_and_refused_where_not_simulated(self):
        def plan(*extra):
            return subprocess.run([SHARDFIT, "plan", "--trace", self.trace, "--stack", "pytorch", "--device", "cpu",
                                   "--gpus", "2", "--gpu-mem", "16MiB", "--strategies", "ddp/fp32/wrap=none", "--json"]
                                  + list(extra), capture_output=True, text=True, timeout=300)
        one, two = plan(), plan("--grad-accum", "2")
        self.assertEqual(two.returncode, 0, two.stderr)
        one, two = json.loads(one.stdout), json.loads(two.stdout)
        self.assertEqual(two["grad_accum"], 2)
        # The first micro-batch's gradients live through the second's forward:
        # a micro-batch fits no more sequences than a step of one.
        self.assertLessEqual(two["candidates"][0]["max_batch_per_gpu"], one["candidates"][0]["max_batch_per_gpu"])
        phases = [p["phase"] for p in two["candidates"][0]["predicted"]["rank_timelines"][0]]
        self.assertEqual(phases[1:6], ["step1.1/forward", "step1.1/backward", "step1.2/forward", "step1.2/backward",
                                       "step1/optimizer"])
        bad = plan("--grad-accum", "2", "--ddp-bucket-view")
        self.assertEqual(bad.returncode, 2)
        self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
        self.assertIn("--grad-accum with --ddp-bucket-view", bad.stderr)

    def test_a_trace_for_cuda_plans_on_a_gpu_profile_and_not_on_the_cpu(self):
        cuda = os.path.join(self.tmp.name, "cuda.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--target", "cuda", "--out", cuda], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(cuda) as fh:
            traced = json.load(fh)
        self.assertEqual(traced["target"], "cuda")
        # Under CUDA's autocast: fp16 (with GradScaler's scaled backward), never bf16.
        self.assertEqual({t["dtype"] for t in traced["traces"] if t.get("autocast")}, {"fp16"})

        def dropout_allocs(trace_file_json):  # what the first attention dropout allocates, batch 1, fp32
            mods = [m["path"] for m in trace_file_json["modules"]]
            t = next(t for t in trace_file_json["traces"] if t["batch"] == 1 and t["grads"] == "none"
                     and not t.get("autocast") and not t.get("checkpoint"))
            where = mods.index("transformer.h.0.attn.attn_dropout")
            return [e[4] for e in t["events"] if e[0] == "alloc" and e[1] == "forward" and e[2] == where]
        # CUDA's dropout (at::dropout takes native_dropout for a CUDA tensor):
        # the bool mask (4 heads x 64 x 64 bytes), then the fp32 output. The
        # CPU's: a float noise tensor, its scale (div_'s wrapped scalars) and
        # the product.
        self.assertEqual(dropout_allocs(traced), [16384, 65536])
        self.assertEqual(dropout_allocs(self.hf_file), [65536, 8, 4, 65536])

        def kept(trace_file):  # the bytes of what batch 1's fp16 forward returned, which the loop holds
            with open(trace_file) as fh:
                t = next(t for t in json.load(fh)["traces"]
                         if t.get("autocast") and t["batch"] == 1 and t["grads"] == "none")
            sizes = {e[3]: e[4] for e in t["events"] if e[0] == "alloc"}
            return sorted(sizes[i] for i in t["kept_outputs"])
        # gpt2-hf2022-tiny at 1 x 64 returns (loss, logits, presents): the fp32
        # loss (4 B), fp16 logits (64 x 512 x 2) and, per layer, the fp16 c_attn
        # output its keys and values are views of (64 x 192 x 2).
        self.assertEqual(kept(cuda), [4, 24576, 24576, 65536])
        # --fp32-outputs (Accelerate's convert_outputs_to_fp32): the logits and
        # each key and value copied to fp32 (64 x 512 x 4; 4 heads x 64 x 16 x 4).
        accelerate = os.path.join(self.tmp.name, "cuda-accelerate.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--target", "cuda", "--fp32-outputs", "--out", accelerate],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(kept(accelerate), [4] + [16384] * 4 + [131072])
        out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--stack", "pytorch", "--device", "titan-rtx-24gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--zero-grad", "zero", "--json"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(sorted(c["id"] for c in json.loads(out.stdout)["candidates"]),
                         ["ddp+ckpt/fp32/wrap=none", "ddp/fp16/wrap=none", "ddp/fp32/wrap=none",
                          "zero1+ckpt/fp32/wrap=none", "zero1/fp16/wrap=none", "zero1/fp32/wrap=none"])
        for c in json.loads(out.stdout)["candidates"]:
            p = c["predicted"]
            self.assertGreaterEqual(p["peak_reserved_bytes"], p["peak_allocated_bytes"])  # segments hold blocks
        # FSDP by transformer_auto_wrap_policy: each of the 2 blocks (the
        # model's block_class) a unit, the root the rest.
        out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--stack", "pytorch", "--device", "titan-rtx-24gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--strategies",
                              "zero3/fp32/wrap=block,zero3/fp32/wrap=size:100000000", "--json"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        units = {c["id"]: c["units"] for c in json.loads(out.stdout)["candidates"]}
        self.assertEqual(units, {"zero3/fp32/wrap=block": 3, "zero3/fp32/wrap=size:100000000": 1})
        out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--stack", "pytorch", "--device", "cpu"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 2)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("recorded for CUDA's kernels", out.stderr)
        # FSDP's backward_prefetch: a PyTorch option; DDP's bucket_cap_mb is
        # both stacks' (shardfit's engine buckets its all-reduces by it too).
        for extra, message in ((["--stack", "pytorch", "--fsdp-backward-prefetch", "sideways"],
                                "--fsdp-backward-prefetch sideways: expected pre"),
                               (["--fsdp-backward-prefetch", "post"], "give --stack pytorch"),
                               (["--stack", "pytorch", "--ddp-bucket-cap-mb", "0"], "--ddp-bucket-cap-mb 0: must be at least one byte"),
                               (["--stack", "pytorch", "--prefetch", "3"], "--prefetch 3: FSDP1 prefetches one unit"),
                               (["--single-gpu-unwrapped"], "give --stack pytorch"),
                               (["--loop-keeps", "loss"], "--loop-keeps: what a PyTorch training loop holds; give "
                                                          "--stack pytorch"),
                               (["--stack", "pytorch", "--loop-keeps", "logits"],
                                "--loop-keeps logits: expected outputs or loss"),
                               (["--stack", "pytorch", "--gpus", "2", "--single-gpu-unwrapped"],
                                "--single-gpu-unwrapped: a one-process job's option")):
            out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--device", "titan-rtx-24gb"] + extra,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn(message, out.stderr)
        out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--stack", "pytorch", "--device", "titan-rtx-24gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--fsdp-backward-prefetch", "none", "--strategies",
                              "zero3/fp32/wrap=block", "--json"], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        out = subprocess.run([SHARDFIT, "plan", "--trace", cuda, "--stack", "pytorch", "--device", "titan-rtx-24gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--ddp-bucket-cap-mb", "0.5", "--strategies",
                              "ddp/fp32/wrap=none", "--json"], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_fsdp_mixed_precision_plans_from_the_model_traced_in_bf16(self):
        """--param-dtype bf16: the model cast to bf16, as FSDP's
        MixedPrecision(param_dtype=torch.bfloat16) computes; plan's zero3/bf16
        candidates replay it (planner/pytorch_fsdp.cc)."""
        mixed, traced, cast = self._record_bf16_traces()
        batch = self._check_bf16_plans_and_their_fsdp_kwargs(mixed)
        fp32_only = self._check_bf16_refusals(mixed, traced, cast)
        self._check_one_gpu_and_shardfit_stack_bf16(mixed, fp32_only, batch)
        self._check_fsdp2_plans(mixed)
        self._check_adamw_steps(mixed)
        bf16 = self._check_reduce_dtypes(mixed)
        self._check_fp16_plans(mixed)
        job, low = self._backward_of(mixed, "--fsdp-keep-low-precision-grads")
        self.assertTrue(job["fsdp_keep_low_precision_grads"])
        self.assertGreaterEqual(low["batch"], bf16["batch"])
        if low["batch"] == bf16["batch"]:
            self.assertLess(low["allocated_bytes"], bf16["allocated_bytes"])

    def _record_bf16_traces(self):
        """Records gpt2-hf2022-tiny cast to bf16 for CUDA: (its file, its JSON, the cast model's traces)."""
        mixed = os.path.join(self.tmp.name, "cuda-mixed.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--target", "cuda", "--param-dtype", "bf16", "--out", mixed],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(mixed) as fh:
            traced = json.load(fh)
        cast = [t for t in traced["traces"] if t["dtype"] == "bf16" and not t.get("autocast") and not t["recompute"]]
        self.assertEqual(sorted((t["batch"], t["grads"]) for t in cast),
                         [(b, g) for b in (1, 2, 3) for g in ("accumulate", "none")])
        # And with every block checkpointed, both kinds (FSDP2 bf16 +ckpt).
        checkpointed = [t for t in traced["traces"] if t["dtype"] == "bf16" and t["recompute"]]
        self.assertEqual(sorted((t["batch"], t["grads"], t.get("checkpoint", "non_reentrant")) for t in checkpointed),
                         [(b, g, k) for b in (1, 2, 3) for g in ("accumulate", "none")
                          for k in ("non_reentrant", "reentrant")])

        def kept_grads(dtype):  # what a batch-1 step with no .grad at its start leaves: the gradients
            t = next(t for t in traced["traces"] if t["dtype"] == dtype and not t.get("autocast")
                     and t["batch"] == 1 and t["grads"] == "none" and not t["recompute"])
            return replay_peak(t["events"])[1]
        # Each gradient is its bf16 parameter's: half of fp32's, byte for byte.
        self.assertEqual(2 * kept_grads("bf16"), kept_grads("fp32"))
        return mixed, traced, cast

    def _plan_traced(self, trace, strategies, device="a100-40gb", *extra):
        """plan --stack pytorch of a traced file over 2 GPUs of 2 GiB, as JSON."""
        return subprocess.run([SHARDFIT, "plan", "--trace", trace, "--stack", "pytorch", "--device", device,
                               "--gpus", "2", "--gpu-mem", "2GiB", "--strategies", strategies, "--json"]
                              + list(extra), capture_output=True, text=True, timeout=300)

    def _check_bf16_plans_and_their_fsdp_kwargs(self, mixed):
        """zero3/bf16 fits more than fp32, timed and chosen by tokens/s; export-config wraps by the traced block."""
        out = self._plan_traced(mixed, "zero3/fp32/wrap=block,zero3/bf16/wrap=block")
        self.assertEqual(out.returncode, 0, out.stderr)
        batch = {c["id"]: c["max_batch_per_gpu"] for c in json.loads(out.stdout)["candidates"]}
        # Activations and the gathered units in bf16: more sequences fit.
        self.assertGreater(batch["zero3/bf16/wrap=block"], batch["zero3/fp32/wrap=block"])
        # Each candidate's step timed as PyTorch overlaps it (planner/pytorch_plan.cc),
        # and the plan chooses the most tokens/s (the default objective).
        candidates = json.loads(out.stdout)["candidates"]
        for c in candidates:
            p = c["predicted"]
            self.assertGreater(p["step_time_s"], 0, c["id"])
            self.assertAlmostEqual(p["tokens_per_s"], c["max_batch_per_gpu"] * 64 * 2 / p["step_time_s"],
                                   delta=1e-6 * p["tokens_per_s"])
        self.assertEqual(json.loads(out.stdout)["chosen"],
                         max(candidates, key=lambda c: c["predicted"]["tokens_per_s"])["id"])
        # The plan names the traced block class, so the FSDP kwargs can wrap by it.
        plan_file = os.path.join(self.tmp.name, "mixed.plan.json")
        with open(plan_file, "w") as fh:
            fh.write(out.stdout)
        self.assertEqual(json.loads(out.stdout)["model"]["block_class"], "HF2022Block")  # pytorch/models.py's
        out = subprocess.run([SHARDFIT, "export-config", "--plan", plan_file, "--candidate", "zero3/bf16/wrap=block",
                              "--format", "fsdp"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        kwargs = json.loads(out.stdout)["fsdp_kwargs"]
        self.assertEqual(kwargs["auto_wrap_policy"]["transformer_layer_cls"], ["HF2022Block"])
        self.assertEqual(kwargs["mixed_precision"], {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16",
                                                     "buffer_dtype": "bfloat16"})
        return batch

    def _check_bf16_refusals(self, mixed, traced, cast):
        """A card without bf16, a CPU trace and a file without the cast traces: one line, exit 2. Returns that file."""
        # The same file without the cast model's traces, as recorded without --param-dtype.
        fp32_only = os.path.join(self.tmp.name, "cuda-fp32-only.trace.json")
        with open(fp32_only, "w") as fh:
            json.dump(dict(traced, traces=[t for t in traced["traces"] if t["dtype"] != "bf16" or t.get("autocast")]), fh)
        for strategies, device, trace, message in (
                ("zero3/bf16/wrap=block", "titan-rtx-24gb", mixed, "titan-rtx-24gb has no bf16"),
                ("zero3/bf16/wrap=block", "a100-40gb", self.hf_trace, "recorded for the CPU's kernels"),
                ("zero2/bf16/wrap=size:1000", "a100-40gb", fp32_only, "--param-dtype bf16")):
            out = self._plan_traced(trace, strategies, device)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn(message, out.stderr)
        return fp32_only

    def _check_one_gpu_and_shardfit_stack_bf16(self, mixed, fp32_only, batch):
        """One GPU (FSDP1 NO_SHARD; FSDP2 refused), shardfit's own engine in bf16, and the CPU recorder's refusal."""
        # One GPU: 1.13 runs FSDP as NO_SHARD, each unit cast to bf16 whole around its passes; FSDP2's
        # world of one computes in fp32, so its MixedPrecisionPolicy there is refused.
        one = [SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", "a100-40gb", "--gpus", "1",
               "--gpu-mem", "2GiB", "--strategies", "zero3/fp32/wrap=block,zero3/bf16/wrap=block", "--json"]
        out = subprocess.run(one, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        batch1 = {c["id"]: c["max_batch_per_gpu"] for c in json.loads(out.stdout)["candidates"]}
        self.assertGreater(batch1["zero3/bf16/wrap=block"], batch1["zero3/fp32/wrap=block"])
        out = subprocess.run(one + ["--fsdp-version", "2"], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("FSDP2's MixedPrecisionPolicy sharded over one GPU", out.stderr)
        # shardfit's own engine holds a bf16 model so too: --stack shardfit plans bf16 from the same traces.
        out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--device", "a100-40gb", "--gpus", "2",
                              "--gpu-mem", "2GiB", "--strategies", "zero3/bf16/wrap=block", "--json"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreater(json.loads(out.stdout)["candidates"][0]["max_batch_per_gpu"], batch["zero3/fp32/wrap=block"])
        out = subprocess.run([SHARDFIT, "plan", "--trace", fp32_only, "--device", "a100-40gb", "--gpus", "2",
                              "--strategies", "zero3/bf16/wrap=block"], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("a precision needs its traces", out.stderr)
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--param-dtype", "fp16", "--out", os.path.join(self.tmp.name, "cpu-mixed.json")],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("--param-dtype fp16: FSDP's fp16 MixedPrecision with ShardedGradScaler, traced for CUDA only",
                      out.stderr)

    def _check_fsdp2_plans(self, mixed):
        """FSDP2 per block or on the root, HSDP over two nodes, and FSDP2's refusals."""
        # FSDP2 (--fsdp-version 2, planner/pytorch_fsdp2.cc) from the same traces: fully_shard on each
        # block then the root, or on the root alone, its MixedPrecisionPolicy from the bf16 ones.
        fsdp2 = ["--fsdp-version", "2", "--strategies",
                 "zero3/fp32/wrap=block,zero3/bf16/wrap=block,zero2/fp32/wrap=block,zero3/fp32/wrap=none"]
        out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", "a100-40gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--json"] + fsdp2,
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        planned = json.loads(out.stdout)
        self.assertEqual(planned["pytorch_job"]["fsdp_version"], 2)
        self.assertEqual(planned["pytorch_job"]["fsdp_reduce_dtype"], "param")
        batch2 = {c["id"]: c["max_batch_per_gpu"] for c in planned["candidates"]}
        self.assertGreater(batch2["zero3/bf16/wrap=block"], batch2["zero3/fp32/wrap=block"])
        # Gathered per block, not the whole model at once: no fewer sequences fit than with the root alone.
        self.assertGreaterEqual(batch2["zero3/fp32/wrap=block"], batch2["zero3/fp32/wrap=none"])
        units = {c["id"]: c["units"] for c in planned["candidates"]}
        self.assertEqual(units["zero3/fp32/wrap=none"], 1)
        self.assertGreater(units["zero3/fp32/wrap=block"], 1)
        # HSDP (hybrid): fully_shard over a (nodes, gpus per node) mesh, sharded within a node.
        out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", "a100-40gb",
                              "--gpus", "2", "--nodes", "2", "--gpu-mem", "2GiB", "--json", "--fsdp-version", "2",
                              "--strategies", "hybrid/fp32/wrap=block,zero3/fp32/wrap=block"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        batch4 = {c["id"]: c["max_batch_per_gpu"] for c in json.loads(out.stdout)["candidates"]}
        # Sharded over 2 ranks, not 4: each rank holds more, fewer sequences fit.
        self.assertLessEqual(batch4["hybrid/fp32/wrap=block"], batch4["zero3/fp32/wrap=block"])
        self.assertEqual(batch4["hybrid/fp32/wrap=block"], batch2["zero3/fp32/wrap=block"])
        for extra, message in ((["--stack", "pytorch", "--fsdp-version", "3"], "--fsdp-version 3: expected 1"),
                               (["--fsdp-version", "2"], "give --stack pytorch"),
                               (["--fsdp-reduce-dtype", "fp32"], "give --stack pytorch"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--fsdp-keep-low-precision-grads"],
                                "FSDP2 (--fsdp-version 2) has no such option"),
                               (["--adamw-foreach"], "--adamw-foreach: a PyTorch optimizer option"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--fsdp-reduce-dtype", "int8"],
                                "--fsdp-reduce-dtype int8: expected param, fp32, bf16 or fp16"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--fsdp-backward-prefetch", "none"],
                                "FSDP2 (--fsdp-version 2) has no such option"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--strategies",
                                 "zero3/fp32/wrap=size:1000"], "--fsdp-version 2 also hybrid (HSDP) and wrap=block"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--fsdp-use-orig-params"],
                                "--fsdp-use-orig-params: FSDP1's FullyShardedDataParallel option"),
                               (["--stack", "pytorch", "--fsdp-version", "2", "--strategies", "ddp/fp32/wrap=block"],
                                "FSDP1's NO_SHARD as ddp/.../wrap=size:N or block")):
            out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--device", "a100-40gb", "--gpus", "2"] + extra,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn(message, out.stderr)

    def _check_adamw_steps(self, mixed):
        """AdamW's foreach step over FSDP's shards, and each candidate's default step per PyTorch."""
        # AdamW(foreach=True) over FSDP's flat shards (planner/adamw_steps.h):
        # every shard's temporaries alive at once. 1.13's _multi_tensor_adamw
        # makes two lists, the square roots and the denominators
        # (torch._foreach_add), as many bytes as the state it made in step 1
        # (exp_avg, exp_avg_sq); 2.x's divides and adds in place on the one
        # list of square roots (optim/adam.py, _multi_tensor_adam), half the
        # state. The for-loop step holds them one shard at a time.
        def optimizer_rise(*extra):
            out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", "a100-40gb",
                                  "--gpus", "2", "--gpu-mem", "2GiB", "--strategies", "zero3/fp32/wrap=block",
                                  "--json"] + list(extra), capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            points = {p["phase"]: p for p in json.loads(out.stdout)["candidates"][0]["predicted"]["rank_timelines"][0]}
            state = points["step1/optimizer"]["allocated_bytes"] - points["step1/backward"]["allocated_bytes"]
            step2 = points["step2/optimizer"]
            return step2["peak_allocated_bytes"] - step2["allocated_bytes"], state
        rise, state = optimizer_rise("--adamw-foreach")
        self.assertGreater(state, 0)
        lists = 2 if torch.__version__.startswith("1.") else 1
        self.assertEqual(2 * rise, lists * state)
        rise, state = optimizer_rise()
        self.assertLess(rise, state)
        self.assertEqual(optimizer_rise("--adamw-step", "foreach"), optimizer_rise("--adamw-foreach"))
        # Given no foreach=, each candidate's AdamW step is its PyTorch's: 2.x
        # the multi-tensor one on CUDA for plain, Parameter and DTensor
        # parameters (DDP, zero1, FSDP2), the for-loop for FSDP1's
        # FlatParameters and on a CPU; 1.13 always the for-loop.
        def steps(device, *extra):
            out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", device,
                                  "--gpus", "2", "--gpu-mem", "2GiB", "--json", "--strategies",
                                  "ddp/fp32/wrap=none,zero1/fp32/wrap=none,zero3/fp32/wrap=block"] + list(extra),
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            candidates = json.loads(out.stdout)["candidates"]
            for c in candidates:  # adamw_foreach, for readers older than adamw_step
                self.assertEqual(c["adamw_foreach"], c["adamw_step"] == "foreach")
            return {c["id"].split("/")[0]: c["adamw_step"] for c in candidates}
        loop, multi = "for-loop", "foreach"
        self.assertEqual(steps("a100-40gb"), {"ddp": multi, "zero1": multi, "zero3": loop})
        self.assertEqual(steps("a100-40gb", "--fsdp-version", "2"), {"ddp": multi, "zero1": multi, "zero3": multi})
        self.assertEqual(steps("a100-40gb", "--torch", "1.13"), {"ddp": loop, "zero1": loop, "zero3": loop})
        self.assertEqual(steps("a100-40gb", "--adamw-step", "for-loop"), {"ddp": loop, "zero1": loop, "zero3": loop})
        self.assertEqual(steps("a100-40gb", "--adamw-step", "foreach"), {"ddp": multi, "zero1": multi, "zero3": multi})
        if torch.__version__.startswith("1."):
            return  # 1.13's AdamW has no fused step: its traces hold none
        self.assertEqual(steps("a100-40gb", "--adamw-step", "fused"),
                         {"ddp": "fused", "zero1": "fused", "zero3": "fused"})
        # fused=True on CUDA: one kernel updates in place, its step counts on
        # the GPU (4 bytes each, a 512-byte block of the caching allocator);
        # no temporaries, so its step rises least.
        rise, state = optimizer_rise("--adamw-step", "fused")
        self.assertEqual(rise, 0)
        self.assertGreater(state, 0)

    def _check_reduce_dtypes(self, mixed):
        """FSDP's reduce_dtype: fp32 beside bf16 parameters, bf16 beside fp32 ones. Returns the bf16 backward point."""
        # FSDP1's MixedPrecision(reduce_dtype=torch.float32): each unit's bf16
        # flat gradient cast to fp32 and reduced so (the figures by hand:
        # tests/planner_core/pytorch_fsdp_test.cc), the same fp32 shards at
        # the end; with keep_low_precision_grads the reduced shards end bf16:
        # fewer bytes held into the optimizer step.
        job, bf16 = self._backward_of(mixed)
        job32, fp32 = self._backward_of(mixed, "--fsdp-reduce-dtype", "fp32")
        self.assertEqual((job["fsdp_reduce_dtype"], job32["fsdp_reduce_dtype"]), ("param", "fp32"))
        self.assertLessEqual(fp32["batch"], bf16["batch"])
        if fp32["batch"] == bf16["batch"]:
            self.assertEqual(fp32["allocated_bytes"], bf16["allocated_bytes"])
        # fp32 parameters reduced in bf16 (MixedPrecision(reduce_dtype=torch.bfloat16) alone), for both
        # FSDPs: the reduce-scatter moves half the bytes, the two gathers stay fp32: 5/6 of the comm time.
        for version in ("1", "2"):
            def comm(reduce):
                out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device",
                                      "a100-40gb", "--gpus", "2", "--gpu-mem", "2GiB", "--strategies",
                                      "zero3/fp32/wrap=block", "--fsdp-version", version, "--fsdp-reduce-dtype",
                                      reduce, "--json"], capture_output=True, text=True, timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                plan = json.loads(out.stdout)
                self.assertEqual(plan["pytorch_job"]["fsdp_reduce_dtype"], reduce)
                return plan["candidates"][0]["predicted"]["time_breakdown_s"]["comm"]
            self.assertAlmostEqual(comm("bf16") / comm("param"), 5 / 6, delta=0.01)
        return bf16

    def _backward_of(self, mixed, *extra):
        """plan --stack pytorch of zero3/bf16/wrap=block: its PyTorch job, and step 1's backward point (with the
        max batch)."""
        out = subprocess.run([SHARDFIT, "plan", "--trace", mixed, "--stack", "pytorch", "--device", "a100-40gb",
                              "--gpus", "2", "--gpu-mem", "2GiB", "--strategies", "zero3/bf16/wrap=block",
                              "--json"] + list(extra), capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        plan = json.loads(out.stdout)
        points = {p["phase"]: p for p in plan["candidates"][0]["predicted"]["rank_timelines"][0]}
        return plan["pytorch_job"], dict(points["step1/backward"],
                                         batch=plan["candidates"][0]["max_batch_per_gpu"])

    def _check_fp16_plans(self, mixed):
        """fp16 with ShardedGradScaler from the model cast to fp16, with offload and with FSDP2."""
        # fp16: MixedPrecision(param_dtype=torch.float16) with ShardedGradScaler,
        # from the model cast to fp16 (its scaled loss's backward traced), on
        # a card without bf16; as many bytes as bf16's but the scaler's.
        half = os.path.join(self.tmp.name, "cuda-half.trace.json")
        out = subprocess.run([sys.executable, RECORDER, "--model", "gpt2-hf2022-tiny", "--seq-len", "64",
                              "--target", "cuda", "--param-dtype", "fp16", "--out", half],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        out = self._plan_traced(half, "zero3/fp32/wrap=block,zero3/fp16/wrap=block", "titan-rtx-24gb")
        self.assertEqual(out.returncode, 0, out.stderr)
        batch16 = {c["id"]: c["max_batch_per_gpu"] for c in json.loads(out.stdout)["candidates"]}
        self.assertGreater(batch16["zero3/fp16/wrap=block"], batch16["zero3/fp32/wrap=block"])
        out = self._plan_traced(mixed, "zero3/fp16/wrap=block", "titan-rtx-24gb")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("--param-dtype fp16", out.stderr)
        # With offload (the scaler's copies on the host) and with FSDP2.
        for extra in ([], ["--fsdp-version", "2"]):
            out = self._plan_traced(half, "zero3+offload/fp16/wrap=block,zero2/fp16/wrap=block", "titan-rtx-24gb",
                                    *extra)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(all(c["max_batch_per_gpu"] > 0 for c in json.loads(out.stdout)["candidates"]))


if __name__ == "__main__":
    unittest.main()
