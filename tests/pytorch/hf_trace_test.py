"""transformers' own models, built from small configs (no weights), traced by
pytorch/trace_recorder.py --model hf:<Architecture> --config and held
against the real CPU step byte for byte, in eager and sdpa attention."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from torch_required import ROOT  # noqa: E402,F401 (the skip without torch, pytorch/ on the path)
import torch  # noqa: E402
from trace_check import RECORDER, SHARDFIT, TraceCheck  # noqa: E402,F401
from hf_configs import SMALL as HF_CONFIGS  # noqa: E402 (pytorch/hf_configs.py, shared with pytorch-validate)


@unittest.skipIf(torch.__version__.startswith("1."), "the pinned stack's transformers needs torch 2.x")
class HfTraceTest(TraceCheck, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    def record_hf(self, arch, attn, **fields):
        """transformers' own `arch` from HF_CONFIGS with `attn` (and `fields`
        over its config), traced and held against the CPU step: the trace
        file's JSON."""
        import hf_models
        tag = "".join("-%s" % v for v in fields.values())
        config = os.path.join(self.tmp.name, "%s-%s%s.json" % (arch, attn, tag))
        with open(config, "w") as f:
            json.dump(dict(HF_CONFIGS[arch], attn_implementation=attn, **fields), f)
        path = os.path.join(self.tmp.name, "%s-%s%s.trace.json" % (arch, attn, tag))
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", config, "--seq-len", "64",
                              "--out", path], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        with open(path) as f:
            file = json.load(f)
        self.assertEqual(file["model"]["name"], arch)  # the config's architecture, its class
        self.assertEqual(sum(m["is_block"] for m in file["modules"]), 2)  # its most repeated _no_split_modules
        build, inputs, _ = hf_models.factory("", config)
        self.check_every_batch("%s (%s)" % (arch, attn), file, build, inputs)
        self.check_work_is_the_steps_own("%s (%s)" % (arch, attn), file, build, inputs)
        return file

    @staticmethod
    def ops_of(file):
        return {t["op_names"][e[5]] for t in file["traces"][:1] for e in t["events"] if e[0] == "alloc" and e[5] >= 0}

    def test_transformers_gpt2_and_llama_are_traced_exactly_in_eager_and_sdpa(self):
        for arch in ("GPT2LMHeadModel", "LlamaForCausalLM"):
            for attn in ("eager", "sdpa"):
                file = self.record_hf(arch, attn)
                if arch == "LlamaForCausalLM" and attn == "sdpa":
                    # No attention dropout: the CPU's flash kernel, as the real step takes it (no softmax
                    # kept: its scratch is cpu_flash_attention.py's empty tensors).
                    self.assertNotIn("aten::_softmax", self.ops_of(file))
                    # Its products, inside the one op, are counted as FlashAttention-2's (QK^T and PV
                    # forward, five backward, half the rows under the causal mask): 2 and 5 x batch x
                    # heads products of [32 x 64] by [64 x 16] in every batch-2 trace.
                    cfg = HF_CONFIGS[arch]
                    heads, dim = cfg["num_attention_heads"], cfg["head_dim"]
                    for t in file["traces"]:
                        if t["batch"] == 2 and "work" in t:
                            self.assertIn([2 * 2 * heads, 32, 64, dim], t["work"]["forward"]["gemms"])
                            self.assertIn([5 * 2 * heads, 32, 64, dim], t["work"]["backward"]["gemms"])
                if arch == "GPT2LMHeadModel" and attn == "sdpa":
                    # attn_pdrop 0.1 in training: the CPU's math kernel (its softmax kept).
                    self.assertIn("aten::_softmax", self.ops_of(file))
        # An attention the recorder does not trace is refused in one line, naming why.
        config = os.path.join(self.tmp.name, "GPT2LMHeadModel-flash.json")
        path = os.path.join(self.tmp.name, "refused.trace.json")
        with open(config, "w") as f:
            json.dump(dict(HF_CONFIGS["GPT2LMHeadModel"], attn_implementation="flash_attention_2"), f)
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", config, "--seq-len", "64",
                              "--out", path], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("attn_implementation flash_attention_2 is not traced (eager and sdpa are)",
                      out.stderr.strip().splitlines()[-1])

    def test_transformers_qwen2_mistral_and_bert_are_traced_exactly_in_eager_and_sdpa(self):
        for arch in ("Qwen2ForCausalLM", "MistralForCausalLM", "BertForMaskedLM"):
            for attn in ("eager", "sdpa"):
                self.record_hf(arch, attn)

    def plan(self, *args, env=None):
        return subprocess.run([SHARDFIT, "plan", *args], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, **(env or {})))

    def trace_by_hand(self, config, *extra):
        """trace_recorder.py --model hf: on `config` at 64 tokens: the trace file's path."""
        path = config + ".trace.json"
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", config, "--seq-len", "64",
                              *extra, "--out", path], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        return path

    def refused(self, name, fields, *extra):
        """The recorder's one line (exit 2) for a config it cannot trace."""
        config = os.path.join(self.tmp.name, name)
        with open(config, "w") as f:
            json.dump(fields, f)
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", config, "--seq-len", "64",
                              "--out", os.path.join(self.tmp.name, "x.json"), *extra], capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        return out.stderr

    def test_architectures_with_no_builtin_are_traced_exactly_and_planned(self):
        # Mixtral's experts by transformers' default kernel (grouped_mm: its CPU kernel's output,
        # cpu_grouped_mm.py; indexing's backward in place, cpu_index_backward.py, which checkpointing's
        # recomputation puts at the peak) and by batched_mm.
        for arch, attn, fields in (("Gemma2ForCausalLM", "eager", {}), ("Gemma3ForCausalLM", "eager", {}),
                                   ("Phi3ForCausalLM", "eager", {}),
                                   ("Phi3ForCausalLM", "sdpa", {}), ("MixtralForCausalLM", "eager", {}),
                                   ("MixtralForCausalLM", "sdpa", {}),
                                   ("MixtralForCausalLM", "eager", {"experts_implementation": "batched_mm"}),
                                   ("Qwen2MoeForCausalLM", "eager", {})):
            file = self.record_hf(arch, attn, **fields)
            if arch in ("MixtralForCausalLM", "Qwen2MoeForCausalLM"):
                grouped = "aten::_grouped_mm" in {n for t in file["traces"][:1] for n in t["op_names"]}
                self.assertEqual(grouped, not fields, fields)
            tag = "".join("-%s" % v for v in fields.values())
            out = self.plan("--trace", os.path.join(self.tmp.name, "%s-%s%s.trace.json" % (arch, attn, tag)),
                            "--device", "cpu", "--gpus", "2", "--gpu-mem", "64MiB", "--json")
            self.assertEqual(out.returncode, 0, out.stderr)
            plan = json.loads(out.stdout)
            self.assertEqual(plan["model"]["name"], arch)
            self.assertTrue([c for c in plan["candidates"] if c["max_batch_per_gpu"] > 0], arch)
        # The experts' memory is in the parameters: 2 layers x 4 experts x 3 projections of 64 x 96.
        mixtral = json.load(open(os.path.join(self.tmp.name, "MixtralForCausalLM-eager.trace.json")))
        experts = [p for m in mixtral["modules"] for p in m["params"] if ".experts." in p["name"]]
        self.assertEqual(sum(p["numel"] for p in experts), 2 * 4 * 3 * 64 * 96)
        # Gemma-2's sliding layers (window 32 < 64) give sdpa a mask, which the CPU's flash kernel takes: refused.
        self.assertIn("with a mask on the CPU's flash kernel",
                      self.refused("gemma2-sdpa.json", dict(HF_CONFIGS["Gemma2ForCausalLM"], attn_implementation="sdpa")))
        # --attention is the attention of a config that names none: another than the config's own is refused.
        self.assertIn("--attention sdpa: --config %s names attn_implementation eager" %
                      os.path.join(self.tmp.name, "gemma2-eager.json"),
                      self.refused("gemma2-eager.json", dict(HF_CONFIGS["Gemma2ForCausalLM"],
                                                             attn_implementation="eager"), "--attention", "sdpa"))
        # transformers' eager experts kernel routes tokens by the router's values: refused, naming the two traced.
        fields = dict(HF_CONFIGS["MixtralForCausalLM"], experts_implementation="eager")
        self.assertIn('"experts_implementation" to grouped_mm', self.refused("mixtral-eager-experts.json", fields))
        # grouped_mm on CUDA runs a kernel the trace does not imitate: refused for a CUDA target.
        config = os.path.join(self.tmp.name, "mixtral-cuda.json")
        with open(config, "w") as f:
            json.dump(HF_CONFIGS["MixtralForCausalLM"], f)
        out = subprocess.run([sys.executable, RECORDER, "--model", "hf:", "--config", config, "--seq-len", "64",
                              "--out", os.path.join(self.tmp.name, "x.json"), "--target", "cuda"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("experts by grouped_mm are traced for --target cpu only", out.stderr.strip().splitlines()[-1])

    def test_plan_model_traces_a_model_type_with_no_builtin_and_finds_hub_ids_in_the_local_cache(self):
        # A model_type with no built-in: plan traces it through transformers' own class (the recorder, run by the
        # build's Python) and plans that trace exactly as plan --trace plans the same trace recorded by hand. The
        # config names no attn_implementation, so transformers runs sdpa: so does the trace, on a CPU profile.
        config = os.path.join(self.tmp.name, "phi3.json")
        with open(config, "w") as f:
            json.dump(HF_CONFIGS["Phi3ForCausalLM"], f)
        shape = ("--device", "cpu", "--gpus", "2", "--gpu-mem", "64MiB", "--seq-len", "64", "--json")
        by_hand = self.plan("--trace", self.trace_by_hand(config, "--attention", "sdpa"), *shape)
        self.assertEqual(by_hand.returncode, 0, by_hand.stderr)
        traced = self.plan("--model", config, *shape)
        self.assertEqual(traced.returncode, 0, traced.stderr)
        self.assertEqual(json.loads(traced.stdout), json.loads(by_hand.stdout))
        self.assertEqual(json.loads(traced.stdout)["model"]["name"], "Phi3ForCausalLM")
        said = [line for line in traced.stderr.splitlines() if "transformers' own class" in line]
        self.assertEqual(len(said), 1, traced.stderr)
        self.assertIn("model_type 'phi3' has no built-in", said[0])
        self.assertIn("--config %s --attention sdpa --seq-len 64" % config, said[0])
        # Gemma-2's sliding layers (window 32 < 64) give sdpa a mask on the CPU's flash kernel, which the trace
        # cannot follow: the plan is eager's, the same as the trace recorded by hand in eager, and says so once.
        gemma = os.path.join(self.tmp.name, "gemma2.json")
        with open(gemma, "w") as f:
            json.dump(HF_CONFIGS["Gemma2ForCausalLM"], f)
        by_hand = self.plan("--trace", self.trace_by_hand(gemma, "--attention", "eager"), *shape)
        self.assertEqual(by_hand.returncode, 0, by_hand.stderr)
        traced = self.plan("--model", gemma, *shape)
        self.assertEqual(traced.returncode, 0, traced.stderr)
        self.assertEqual(json.loads(traced.stdout), json.loads(by_hand.stdout))
        warned = [line for line in traced.stderr.splitlines() if "[warning]" in line]
        self.assertEqual(len(warned), 1, traced.stderr)
        self.assertIn("transformers runs sdpa where the config names no attn_implementation, and the trace cannot "
                      "follow its kernel here (scaled_dot_product_attention with a mask on the CPU's flash kernel",
                      warned[0])
        self.assertIn("traced in eager instead: set attn_implementation eager to run what is planned", warned[0])
        # No Python to trace with, a model_type transformers does not know, an architecture it has no class for:
        # one line naming the route and why, exit 2.
        def refused_route(config_path, why, env=None, traced=None):
            """plan --model config_path refused; `traced`: the config.json the route names (config_path's own
            when None)."""
            out = self.plan("--model", config_path, "--device", "cpu", env=env)
            self.assertEqual(out.returncode, 2, out.stderr)
            lines = out.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, out.stderr)
            self.assertIn("has no built-in and tracing it through transformers' own class failed", lines[0])
            self.assertIn(why, lines[0])
            self.assertIn("pytorch/trace_recorder.py --model hf: --config %s " % (traced or config_path), lines[0])
            self.assertIn("then plan --trace model.trace.json", lines[0])
        missing = os.path.join(self.tmp.name, "no-such-python")
        refused_route(config, "SHARDFIT_PYTHON=%s is not an executable file" % missing, {"SHARDFIT_PYTHON": missing})
        unknown = os.path.join(self.tmp.name, "acme.json")
        with open(unknown, "w") as f:
            json.dump(dict(HF_CONFIGS["Phi3ForCausalLM"], model_type="acme-lm"), f)
        refused_route(unknown, "transformers cannot build its config")
        no_class = os.path.join(self.tmp.name, "no-class.json")
        with open(no_class, "w") as f:
            json.dump(dict(HF_CONFIGS["Phi3ForCausalLM"], architectures=["Phi3ForNothing"]), f)
        refused_route(no_class, "has no such class")
        # A Hub id whose model_type has no built-in: found in the cache, and its snapshot's config.json is the one
        # the route traces (the tracing itself is the same as for the config's path above, so the Python that
        # would run it is taken away here: the refusal names the file it would have traced).
        hub = os.path.join(self.tmp.name, "hf-home", "hub")
        snapshot = os.path.join(hub, "models--acme--tiny-phi3", "snapshots", "89abcde")
        os.makedirs(snapshot)
        with open(os.path.join(snapshot, "config.json"), "w") as f:
            json.dump(HF_CONFIGS["Phi3ForCausalLM"], f)
        refused_route("acme/tiny-phi3", "SHARDFIT_PYTHON=%s is not an executable file" % missing,
                      {"HF_HUB_CACHE": hub, "SHARDFIT_PYTHON": missing}, traced=os.path.join(snapshot, "config.json"))
        # A Hub id, offline, in a cache laid out as huggingface_hub lays it out.
        hub = os.path.join(self.tmp.name, "hf-home", "hub")
        repo = os.path.join(hub, "models--acme--tiny-llama")
        os.makedirs(os.path.join(repo, "refs"))
        for rev in ("0123abc", "4567def"):  # an older snapshot beside the one refs/main names
            os.makedirs(os.path.join(repo, "snapshots", rev))
            with open(os.path.join(repo, "snapshots", rev, "config.json"), "w") as f:
                json.dump(dict(HF_CONFIGS["LlamaForCausalLM"], num_hidden_layers=3 if rev == "4567def" else 1), f)
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write("4567def")
        out = self.plan("--model", os.path.join(repo, "snapshots", "4567def", "config.json"), *shape)
        self.assertEqual(out.returncode, 0, out.stderr)
        named = json.loads(out.stdout)["model"]["params"]
        for env in ({"HF_HUB_CACHE": hub}, {"HF_HOME": os.path.dirname(hub), "HF_HUB_CACHE": ""}):
            out = self.plan("--model", "acme/tiny-llama", *shape, env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(json.loads(out.stdout)["model"]["params"], named)  # refs/main's snapshot, 3 layers
        out = self.plan("--model", "acme/other", "--device", "cpu", env={"HF_HUB_CACHE": hub})
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("acme/other: no such file, nor a Hub id in the local Hugging Face cache (%s/models--acme--other"
                      % hub, out.stderr)


    def test_stack_pytorch_traces_every_model_through_transformers(self):
        # PyTorch's own step runs the model as transformers builds it: with --stack pytorch a built-in is traced
        # from its config as `shardfit models NAME --hf-config` prints it, in --attention's attention, else
        # transformers' own default, sdpa (on a CPU profile); a config.json whose model_type has a built-in as it
        # is. Each is planned exactly as plan --trace plans the same trace recorded by hand.
        gpus = ("--stack", "pytorch", "--gpus", "2", "--seq-len", "64")
        shape = gpus + ("--device", "cpu", "--gpu-mem", "64MiB")
        configs = {}
        for model in ("gpt2-tiny", "llama-tiny"):
            printed = subprocess.run([SHARDFIT, "models", model, "--hf-config"], capture_output=True, text=True)
            self.assertEqual(printed.returncode, 0, printed.stderr)
            configs[model] = os.path.join(self.tmp.name, "%s.json" % model)
            with open(configs[model], "w") as f:
                f.write(printed.stdout)
        llama = os.path.join(self.tmp.name, "llama-eager.json")
        with open(llama, "w") as f:
            json.dump(dict(HF_CONFIGS["LlamaForCausalLM"], attn_implementation="eager"), f)
        cases = [(("--model", "gpt2-tiny"), configs["gpt2-tiny"], ("--name", "gpt2-tiny", "--attention", "sdpa"),
                  "gpt2-tiny"),
                 (("--model", "llama-tiny"), configs["llama-tiny"], ("--name", "llama-tiny", "--attention", "sdpa"),
                  "llama-tiny"),
                 (("--model", "llama-tiny", "--attention", "eager"), configs["llama-tiny"],
                  ("--name", "llama-tiny", "--attention", "eager"), "llama-tiny"),
                 (("--model", llama), llama, (), "LlamaForCausalLM")]
        plans = {}
        for args, config, extra, name in cases:
            by_hand = self.plan("--trace", self.trace_by_hand(config, *extra), *shape, "--json")
            self.assertEqual(by_hand.returncode, 0, by_hand.stderr)
            traced = self.plan(*args, *shape, "--json")
            self.assertEqual(traced.returncode, 0, traced.stderr)
            plans[args] = json.loads(traced.stdout)
            self.assertEqual(plans[args], json.loads(by_hand.stdout), args)
            self.assertEqual(plans[args]["model"]["name"], name)
            said = [line for line in traced.stderr.splitlines() if "transformers' own class" in line]
            self.assertEqual(len(said), 1, traced.stderr)
            self.assertIn("--stack pytorch runs the model as transformers builds it", said[0])
        # llama-tiny's sdpa is the CPU's flash kernel, which keeps less than eager does.
        self.assertNotEqual(plans["--model", "llama-tiny"]["candidates"],
                            plans["--model", "llama-tiny", "--attention", "eager"]["candidates"])
        # On a CUDA profile the default is eager (CUDA's fp32 sdpa is not traced), said once; --attention sdpa
        # traces cuDNN's attention where 2.11 runs it.
        cuda = self.plan("--model", "gpt2-tiny", *gpus, "--device", "h100-80gb")
        self.assertEqual(cuda.returncode, 0, cuda.stderr)
        warned = [line for line in cuda.stderr.splitlines() if "[warning]" in line]
        self.assertEqual(len(warned), 1, cuda.stderr)
        self.assertIn("gpt2-tiny: traced in eager attention; transformers runs sdpa where the config names no "
                      "attn_implementation, but CUDA's fp32 sdpa (the memory-efficient kernel) is not traced: "
                      "--attention sdpa plans the bf16 and fp16 candidates with cuDNN's attention", warned[0])
        # What transformers' class does not take, and a route that cannot be taken: one line, exit 2.
        missing = os.path.join(self.tmp.name, "no-such-python")
        sdpa = os.path.join(self.tmp.name, "llama-sdpa.json")
        with open(sdpa, "w") as f:
            json.dump(dict(HF_CONFIGS["LlamaForCausalLM"], attn_implementation="sdpa"), f)
        for args, why, env in [
                (("--model", "gpt2-tiny", "--loss", "chunked:2") + shape, "--loss chunked:2: --stack pytorch runs "
                 "transformers' own class", None),
                (("--model", "gpt2-tiny", "--attention", "flash") + shape, "--attention flash: gpt2-tiny is traced "
                 "through transformers' own class, in eager or sdpa attention", None),
                (("--model", llama, "--attention", "sdpa") + shape, "--attention sdpa: %s names attn_implementation "
                 "eager; drop --attention" % llama, None),
                (("--model", "gpt2-tiny", "--attention", "sdpa", "--device", "titan-rtx-24gb") + gpus,
                 "--attention sdpa: a CUDA trace's sdpa is cuDNN's attention, which PyTorch 2.11 runs on compute "
                 "capability 9.0 and 10.0, and titan-rtx-24gb is 7.5; use eager attention", None),
                (("--model", sdpa, "--device", "titan-rtx-24gb") + gpus, "%s names attn_implementation sdpa: a CUDA "
                 "trace's sdpa is cuDNN's attention" % sdpa, None),
                (("--model", "gpt2-tiny") + shape, "gpt2-tiny: --stack pytorch runs the model as transformers builds "
                 "it and tracing it through transformers' own class failed: SHARDFIT_PYTHON=%s is not an executable "
                 "file; the route: shardfit models gpt2-tiny --hf-config > config.json; " % missing,
                 {"SHARDFIT_PYTHON": missing})]:
            out = self.plan(*args, env=env)
            self.assertEqual(out.returncode, 2, out.stderr)
            lines = out.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, out.stderr)
            self.assertIn(why, lines[0])
        out = subprocess.run([SHARDFIT, "models", "--hf-config"], capture_output=True, text=True)
        self.assertEqual((out.returncode, out.stderr.strip()),
                         (2, "shardfit models: error: models --hf-config: name the MODEL"))


if __name__ == "__main__":
    unittest.main()
