"""`shardfit export-config` read by the tools that launch it, with their own code:

- the Accelerate YAML through Accelerate's `accelerate launch` path (its
  config loader, _validate_launch_command, then prepare_multi_gpu_env /
  prepare_deepspeed_cmd_env), and the FullyShardedDataParallelPlugin /
  DeepSpeedPlugin those variables build;
- the DeepSpeed JSON through DeepSpeed's own DeepSpeedConfig (skipped, with
  the reason, where this Python has no deepspeed);
- the Python module (`--format python`) imported and applied to a tiny
  Hugging Face GPT-2 on two Gloo ranks on the CPU: FSDP1, FSDP2, DDP and
  ZeroRedundancyOptimizer, one training step each.

Versions: the pinned stack's (requirements.lock: accelerate 1.15.0, torch
2.11.0, transformers 5.17.0, deepspeed 0.19.8)."""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest
import warnings
from unittest import mock

from torch_required import ROOT  # noqa: E402 (the skip without torch)
import torch  # noqa: E402

try:
    import accelerate  # noqa: F401
except ImportError:
    print("skipped: this python3 (%s) has no accelerate: scripts/install-deps makes .venv/ with the pinned "
          "stack's" % sys.executable)
    sys.exit(77)

SHARDFIT = os.environ.get("SHARDFIT_BINARY", os.path.join(ROOT, "build", "cli", "shardfit"))
TINY = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64, bos_token_id=0,
            eos_token_id=0)  # transformers' GPT2Config


def shardfit(*args):
    return subprocess.run([SHARDFIT, *args], capture_output=True, text=True, timeout=300)


def has_deepspeed():
    return importlib.util.find_spec("deepspeed") is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_module(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_gpt2():
    import transformers
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY))


def rank_main(rank, port, modules, failures):
    """One Gloo rank: each exported module applied to a fresh tiny GPT-2, one step."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    try:
        for path, check in modules:
            try:
                m = load_module(path)
                if check["kind"].endswith("-offload"):
                    check_offload_kwargs(m, check["kind"])
                    continue
                model = m.apply(tiny_gpt2())
                optimizer = m.make_optimizer(model, lr=1e-3)
                ids = torch.randint(0, TINY["vocab_size"], (min(m.BATCH_SIZE_PER_GPU, 4), 16))
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                assert torch.isfinite(loss).item(), "loss %s" % loss
                check_wrapping(model, optimizer, check)
            except Exception as e:  # noqa: BLE001: reported to the parent with the module's name
                failures.append("rank %d %s: %s: %s" % (rank, os.path.basename(path), type(e).__name__, e))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    import rank_exit  # pytorch/rank_exit.py
    rank_exit.leave()  # every failure is on the manager's list already


def check_offload_kwargs(m, kind):
    """+offload: FSDP's CPU offload pins host memory, which needs CUDA ("Found no NVIDIA
    driver" on this machine), so here only the objects apply() passes are checked."""
    if kind == "fsdp1-offload":
        from torch.distributed.fsdp import CPUOffload
        kwargs = m.fsdp_kwargs(tiny_gpt2())
        assert kwargs["cpu_offload"] == CPUOffload(offload_params=True), kwargs["cpu_offload"]
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy
        kwargs = m.fully_shard_kwargs(m.device_mesh())
        assert isinstance(kwargs["offload_policy"], CPUOffloadPolicy), kwargs["offload_policy"]


def check_wrapping(model, optimizer, check):
    """What apply() built is PyTorch's object for the candidate."""
    kind = check["kind"]
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        assert isinstance(model, FullyShardedDataParallel), type(model)
        # HYBRID_SHARD over one process per node shards over a group of one, which
        # FSDP1 runs as NO_SHARD (torch 2.11 fsdp/_init_utils.py: "We clamp the
        # strategy to NO_SHARD for world size of 1").
        want = "NO_SHARD" if check["strategy"] == "HYBRID_SHARD" else check["strategy"]
        assert model.sharding_strategy == ShardingStrategy[want], model.sharding_strategy
        units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
        assert len(units) == check["units"] or (check["units"] is None and len(units) > 3), len(units)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        assert len(units) == check["units"] or (check["units"] is None and len(units) > 3), len(units)
        assert all(isinstance(p, DTensor) for p in model.parameters())
    else:
        from torch.nn.parallel import DistributedDataParallel
        from torch.distributed.optim import ZeroRedundancyOptimizer
        assert isinstance(model, DistributedDataParallel), type(model)
        assert isinstance(optimizer, ZeroRedundancyOptimizer) == (kind == "zero1"), type(optimizer)


class ExportConfigTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.plan = cls.make_plan("plan.json", gpus=2, nodes=1)
        cls.two_nodes = cls.make_plan("plan2.json", gpus=1, nodes=2)
        # A plan for FSDP2: the same candidates as `plan --stack pytorch
        # --fsdp-version 2` records them (its pytorch_job), which is all the
        # export reads of it.
        with open(cls.plan) as f:
            p = json.load(f)
        p["stack"] = "pytorch"
        p["pytorch_job"] = {"zero_grad": "none", "checkpoint": "non-reentrant", "ddp_bucket_cap_bytes": 26214400,
                            "fsdp_backward_prefetch": "pre", "steps": 2, "fsdp_version": 2,
                            "fsdp_reduce_dtype": "param", "adamw_foreach": False,
                            "fsdp_keep_low_precision_grads": False, "torch": "2.11"}
        cls.fsdp2 = os.path.join(cls.tmp.name, "plan-fsdp2.json")
        with open(cls.fsdp2, "w") as f:
            json.dump(p, f)
        # And for FSDP1, with the ddp candidate by block that `plan --stack
        # pytorch --strategies ddp/fp32/wrap=block` plans as NO_SHARD.
        p["pytorch_job"]["fsdp_version"] = 1
        ddp = next(c for c in p["candidates"] if c["id"] == "ddp/fp32/wrap=none")
        p["candidates"].append(dict(ddp, id="ddp/fp32/wrap=block", wrap="block"))
        cls.fsdp1 = os.path.join(cls.tmp.name, "plan-fsdp1.json")
        with open(cls.fsdp1, "w") as f:
            json.dump(p, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def make_plan(cls, name, gpus, nodes):
        path = os.path.join(cls.tmp.name, name)
        r = shardfit("plan", "--model", "gpt2-tiny", "--seq-len", "64", "--gpus", str(gpus), "--nodes", str(nodes),
                     "--device", "cpu", "--gpu-mem", "16MiB", "--precision", "all", "--out", path)
        assert r.returncode == 0, r.stderr
        return path

    def export(self, plan, candidate, fmt, *extra):
        out = os.path.join(self.tmp.name, "%s-%s-%s.%s" % (
            os.path.basename(plan)[:-5].replace("-", "_"), fmt, "".join(ch if ch.isalnum() else "_" for ch in candidate),
            {"python": "py", "accelerate": "yaml"}.get(fmt, "json")))
        r = shardfit("export-config", "--plan", plan, "--candidate", candidate, "--format", fmt, "--out", out, *extra)
        self.assertEqual(r.returncode, 0, candidate + " " + fmt + ": " + r.stderr)
        return out, r.stderr

    def candidates(self, plan):
        """The plan's candidates that fit, one per sharding/offload/checkpointing
        combination (wrap=block where there is one), and zero3's other wraps and
        precisions, zero1's and ddp's bf16: every key a format writes, without
        exporting all 114 (each export starts the binary, LibTorch and all)."""
        with open(plan) as f:
            ids = [c["id"] for c in json.load(f)["candidates"] if c["max_batch_per_gpu"] > 0]
        chosen = {}
        for cid in ids:
            parts, precision, wrap = cid.split("/")
            if precision == "fp32" and (parts not in chosen or wrap == "wrap=block"):
                chosen[parts] = cid
        extra = ["zero3/fp32/wrap=none", "zero3/fp32/wrap=size:2000", "zero3/fp16/wrap=block", "zero3/bf16/wrap=block",
                 "zero1/bf16/wrap=none", "ddp/bf16/wrap=none"]
        return list(chosen.values()) + [cid for cid in extra if cid in ids]

    # -- Accelerate -------------------------------------------------------

    def accelerate_env(self, yaml_path):
        """What `accelerate launch --config_file yaml_path train.py` hands the script."""
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
        args = launch_command_parser().parse_args(["--config_file", yaml_path, "train.py"])
        args, defaults, mp_from_config_flag = _validate_launch_command(args)
        if args.use_deepspeed:
            # What launch_command does before deepspeed_launcher (Accelerate 1.15
            # commands/launch.py), which prepare_deepspeed_cmd_env reads.
            fields = list(defaults.deepspeed_config.keys()) if defaults else []
            if mp_from_config_flag:
                fields.append("mixed_precision")
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            return args, prepare_deepspeed_cmd_env(args)[1]
        return args, prepare_multi_gpu_env(args)

    def fsdp_plugin(self, env):
        """Accelerate's FullyShardedDataParallelPlugin from the launch's variables. With
        sync_module_states it asks for the current CUDA device (utils/dataclasses.py
        __post_init__, Accelerate 1.15), which this CPU machine lacks: device 0 stands in."""
        import accelerate.utils.dataclasses as dataclasses
        with mock.patch.dict(os.environ, env), mock.patch.object(dataclasses, "is_cuda_available", lambda: True), \
                mock.patch.object(torch.cuda, "current_device", lambda: 0):
            return dataclasses.FullyShardedDataParallelPlugin()

    def test_accelerate_builds_the_planned_plugin_for_every_candidate(self):
        from accelerate.commands.config.config_args import load_config_from_file
        from torch.distributed.fsdp import ShardingStrategy
        checked = 0
        for plan, extra in ((self.plan, ()), (self.two_nodes, ("--main-process-ip", "10.1.2.3")), (self.fsdp2, ())):
            for cid in self.candidates(plan):
                r = shardfit("export-config", "--plan", plan, "--candidate", cid, "--format", "accelerate", *extra)
                if r.returncode == 2:  # refused: one line saying why
                    self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
                    self.assertRegex(r.stderr, "offload|FSDP2|wrap=none")
                    continue
                self.assertEqual(r.returncode, 0, r.stderr)
                path = os.path.join(self.tmp.name, "a.yaml")
                with open(path, "w") as f:
                    f.write(r.stdout)
                config = load_config_from_file(path)
                sharding = cid.split("/")[0].split("+")[0]
                with self.subTest(candidate=cid, plan=os.path.basename(plan)):
                    args, env = self.accelerate_env(path)
                    self.assertEqual(env["ACCELERATE_MIXED_PRECISION"], {"fp32": "no"}.get(cid.split("/")[1],
                                                                                            cid.split("/")[1]))
                    if extra:
                        self.assertEqual((config.main_process_ip, config.main_process_port), ("10.1.2.3", 29500))
                    if sharding == "ddp":
                        self.assertEqual(config.distributed_type.value, "MULTI_GPU")
                        self.assertTrue(args.multi_gpu)
                    elif sharding == "zero1":
                        self.check_deepspeed_plugin(cid, env)
                    else:
                        plugin = self.fsdp_plugin(env)
                        fsdp2 = plan == self.fsdp2
                        self.assertEqual(plugin.fsdp_version, 2 if fsdp2 else 1)
                        if fsdp2:
                            self.assertEqual(plugin.reshard_after_forward, sharding == "zero3")
                        else:
                            want = {"zero2": "SHARD_GRAD_OP", "zero3": "FULL_SHARD", "hybrid": "HYBRID_SHARD"}[sharding]
                            self.assertEqual(plugin.sharding_strategy, ShardingStrategy[want])
                            self.assertFalse(plugin.use_orig_params)
                            self.assertTrue(plugin.sync_module_states)
                        if fsdp2:
                            from torch.distributed.fsdp import CPUOffloadPolicy
                            self.assertEqual(isinstance(plugin.cpu_offload, CPUOffloadPolicy), "+offload" in cid)
                        else:
                            self.assertEqual(plugin.cpu_offload.offload_params, "+offload" in cid)
                        self.assertEqual(plugin.activation_checkpointing, "+ckpt" in cid)
                    checked += 1
        self.assertGreater(checked, 25)

    def check_deepspeed_plugin(self, cid, env):
        from accelerate.utils import DeepSpeedPlugin
        with mock.patch.dict(os.environ, env):
            plugin = DeepSpeedPlugin()
        self.assertEqual(plugin.zero_stage, 1)
        self.assertEqual(plugin.offload_optimizer_device, "cpu" if "+offload" in cid else "none")
        self.assertEqual(plugin.deepspeed_config["zero_optimization"]["stage"], 1)

    # -- DeepSpeed --------------------------------------------------------

    @unittest.skipUnless(has_deepspeed(), "this Python has no deepspeed (requirements.lock pins 0.19.8: "
                         "scripts/install-deps installs it)")
    def test_deepspeed_config_class_accepts_every_candidate(self):
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig

        class DataParallel:  # the `mpu` DeepSpeedConfig asks for the data-parallel world
            def __init__(self, world):
                self.world = world

            def get_data_parallel_world_size(self):
                return self.world

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
        deepspeed.init_distributed(dist_backend="gloo")
        for plan in (self.plan, self.two_nodes):
            with open(plan) as f:
                world = json.load(f)["hardware"]
            world = world["gpus_per_node"] * world["nodes"]
            for cid in self.candidates(plan):
                with self.subTest(candidate=cid):
                    path, notes = self.export(plan, cid, "deepspeed")
                    with warnings.catch_warnings():  # DeepSpeed's loader leaves the file open
                        warnings.simplefilter("ignore", ResourceWarning)
                        ds = DeepSpeedConfig(path, mpu=DataParallel(world))
                    sharding = cid.split("/")[0].split("+")[0]
                    stage = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "hybrid": 3}[sharding]
                    self.assertEqual(ds.zero_optimization_stage, stage)
                    with open(path) as f:
                        raw = json.load(f)
                    self.assertEqual(ds.train_batch_size, raw["train_micro_batch_size_per_gpu"] * world)
                    self.assertEqual(ds.bfloat16_config.enabled, "/bf16/" in cid)
                    self.assertEqual(ds.float16_config.enabled, "/fp16/" in cid)
                    if "+offload" in cid:
                        # With offload and no optimizer section, a client optimizer makes
                        # DeepSpeed raise ZeRORuntimeException (runtime/engine.py).
                        self.assertEqual(ds.optimizer_name, "adamw")
                        self.assertEqual(ds.zero_config.offload_optimizer.device, "cpu")
                        self.assertEqual(ds.zero_config.offload_param is not None, stage == 3)
                        if stage < 3:
                            self.assertIn("differs from the plan", notes)
                    if sharding == "hybrid":
                        self.assertEqual(ds.zero_config.zero_hpz_partition_size, 1)  # one GPU per node

    # -- the Python module on a CPU mesh ------------------------------------

    def test_python_modules_train_a_step_on_two_gloo_ranks(self):
        self.maxDiff = None
        b = "wrap=block"
        cases = [
            (self.plan, "ddp/fp32/wrap=none", dict(kind="ddp")),
            (self.plan, "zero1/fp32/wrap=none", dict(kind="zero1")),
            (self.plan, "ddp+ckpt/fp32/" + b, dict(kind="ddp")),
            (self.plan, "zero3/fp32/" + b, dict(kind="fsdp1", strategy="FULL_SHARD", units=3)),
            (self.plan, "zero2/bf16/" + b, dict(kind="fsdp1", strategy="SHARD_GRAD_OP", units=3)),
            (self.plan, "zero3+ckpt/fp32/" + b, dict(kind="fsdp1", strategy="FULL_SHARD", units=3)),
            (self.plan, "zero3+offload/fp32/" + b, dict(kind="fsdp1-offload")),
            (self.two_nodes, "hybrid/fp32/" + b, dict(kind="fsdp1", strategy="HYBRID_SHARD", units=3)),
            (self.fsdp1, "ddp/fp32/" + b, dict(kind="fsdp1", strategy="NO_SHARD", units=3)),
            (self.fsdp2, "zero3/bf16/" + b, dict(kind="fsdp2", units=3)),
            (self.fsdp2, "zero2/fp32/" + b, dict(kind="fsdp2", units=3)),
            (self.fsdp2, "zero3+ckpt/fp32/" + b, dict(kind="fsdp2", units=3)),
            (self.fsdp2, "zero2+offload/bf16/" + b, dict(kind="fsdp2-offload")),
        ]
        # FSDP1's size rule by hand: with 2,000 parameters, every Linear-like
        # module of the tiny GPT-2 is a unit.
        cases.append((self.fsdp2, "zero3/fp32/wrap=size:2000", dict(kind="fsdp2", units=None)))
        cases.append((self.plan, "zero2/fp32/wrap=size:2000", dict(kind="fsdp1", strategy="SHARD_GRAD_OP",
                                                                  units=None)))
        modules = []
        for plan, cid, check in cases:
            path, _ = self.export(plan, cid, "python")
            modules.append((path, check))
        import torch.multiprocessing as mp
        with mp.Manager() as manager:
            failures = manager.list()
            mp.start_processes(rank_main, args=(free_port(), modules, failures), nprocs=2, join=True,
                               start_method="spawn")
            self.assertEqual(list(failures), [])

    def test_refusals_are_one_line_exit_two(self):
        for plan, cid, fmt, why in (
                (self.plan, "zero1+offload/fp32/wrap=none", "python", "no offload"),
                (self.plan, "zero1+offload/fp32/wrap=none", "fsdp", "no offload"),
                (self.plan, "zero3+ckpt/fp32/wrap=none", "fsdp", "wrap=none"),
                (self.fsdp2, "zero3/fp32/wrap=block", "accelerate", None),
                (self.two_nodes, "hybrid/fp32/wrap=block", "accelerate", "--main-process-ip")):
            r = shardfit("export-config", "--plan", plan, "--candidate", cid, "--format", fmt)
            if why is None:  # exported, not refused
                self.assertEqual(r.returncode, 0, r.stderr)
                continue
            self.assertEqual(r.returncode, 2, cid + " " + fmt + ": " + r.stderr)
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertIn(why, r.stderr)


if __name__ == "__main__":
    unittest.main()
