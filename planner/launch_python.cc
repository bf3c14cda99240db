// `export-config --format python`: the candidate as a Python module the
// training script imports. apply(model) builds PyTorch's own objects (torch
// 2.11's torch.distributed.fsdp, torch.nn.parallel, torch.distributed.optim)
// the way planner/ simulated them, and make_optimizer(model) the optimizer:
//
//   FSDP1   FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.X,
//           auto_wrap_policy=functools.partial(...), cpu_offload=CPUOffload(...),
//           mixed_precision=MixedPrecision(...), backward_prefetch, device_id,
//           sync_module_states (on a GPU), use_orig_params as planned, ...)
//   FSDP2   fully_shard(unit, mesh=..., reshard_after_forward=..., mp_policy=
//           MixedPrecisionPolicy(...), offload_policy=CPUOffloadPolicy()) on
//           every unit, then the root (as pytorch/validate.py and
//           scripts/fsdp_reference.py apply it)
//   ddp     DistributedDataParallel(model, device_ids=..., bucket_cap_mb=...)
//   zero1   the same, and ZeroRedundancyOptimizer(..., optimizer_class=AdamW)
//
// The module only defines functions and constants; importing it touches no
// process group. tests/pytorch/export_config_test.py runs each kind on a CPU
// mesh.
#include <sstream>
#include <string>

#include "planner/launch_config_parts.h"

namespace shardfit::planner::launch {
namespace {

std::string py_bool(bool b) { return b ? "True" : "False"; }
std::string py_str(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) q += (ch == '"' || ch == '\\') ? std::string("\\") + ch : std::string(1, ch);
  return q + "\"";
}
std::string py_dtype(DType d) { return std::string("torch.") + torch_dtype(d); }

enum class Family : uint8_t { kDdp, kFsdp1, kFsdp2 };

Family family_of(const Plan& plan, const Candidate& c) {
  if (planned_ddp(plan, c)) return Family::kDdp;
  return planned_fsdp2(plan) ? Family::kFsdp2 : Family::kFsdp1;
}

// The docstring, imports and constants every module opens with.
void write_header(std::ostringstream& py, const Plan& plan, const PlanCandidate& pc, Family family,
                  const WrapPolicyText& wrap, const std::string& block_class) {
  const Candidate& c = pc.candidate;
  const char* what = family == Family::kFsdp1   ? "FSDP1 (FullyShardedDataParallel)"
                     : family == Family::kFsdp2 ? "FSDP2 (fully_shard)"
                     : c.sharding == Sharding::kZero1
                         ? "DistributedDataParallel with ZeroRedundancyOptimizer (PyTorch's ZeRO-1)"
                         : "DistributedDataParallel";
  py << "\"\"\"shardfit export-config: " << pc.id() << " for " << plan.model.name << ", seq len "
     << plan.model.seq_len << ", as " << what << ".\n\n"
     << "In the training script, after torch.distributed.init_process_group and building the model\n"
     << "on the CPU (apply moves it to this process's device):\n\n"
     << "    model = this_module.apply(model)\n"
     << "    optimizer = this_module.make_optimizer(model, lr=...)\n\n"
     << "and train BATCH_SIZE_PER_GPU sequences per process, GRADIENT_ACCUMULATION_STEPS micro-batches\n"
     << "per optimizer step, on WORLD_SIZE processes (" << plan.hardware.nodes << " node(s) x "
     << plan.hardware.gpus_per_node << ").";
  if (family == Family::kDdp && c.precision != Precision::kFp32)
    py << " Run the forward under torch.autocast(device_type, dtype=" << py_dtype(compute_dtype(c.precision))
       << "), as the plan's mixed precision did.";
  if (family == Family::kFsdp1 && c.precision == Precision::kFp16)
    py << " fp16 needs torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler for loss scaling.";
  py << "\n\"\"\"\n"
     << "import functools\nimport os\n\nimport torch\nimport torch.distributed\n\n"
     << "CANDIDATE = " << py_str(pc.id()) << "\n"
     << "BATCH_SIZE_PER_GPU = " << pc.max_batch_per_gpu << "\n"
     << "GRADIENT_ACCUMULATION_STEPS = " << plan.grad_accum << "\n"
     << "WORLD_SIZE = " << plan.hardware.world_size() << "\n"
     << "NNODES = " << plan.hardware.nodes << "\n"
     << "NPROC_PER_NODE = " << plan.hardware.gpus_per_node << "\n";
  if (wrap.kind == "block") py << "BLOCK_CLASS = " << py_str(block_class) << "\n";
  if (wrap.kind == "size") py << "MIN_NUM_PARAMS = " << wrap.min_num_params << "\n";
  py << "\n\n"
     << "def local_device():\n"
     << "    \"\"\"This process's device: cuda:LOCAL_RANK where CUDA is available, else the CPU.\"\"\"\n"
     << "    if torch.cuda.is_available():\n"
     << "        return torch.device(\"cuda\", int(os.environ.get(\"LOCAL_RANK\", \"0\")))\n"
     << "    return torch.device(\"cpu\")\n";
  if (wrap.kind == "block")
    py << "\n\n"
       << "def block_classes(model):\n"
       << "    \"\"\"The classes of the model's modules named BLOCK_CLASS: the plan's units.\"\"\"\n"
       << "    found = {type(m) for m in model.modules() if type(m).__name__ == BLOCK_CLASS}\n"
       << "    if not found:\n"
       << "        raise ValueError(\"no module of class %s in the model (the plan's wrap=block units)\" % "
          "BLOCK_CLASS)\n"
       << "    return found\n";
}

// FSDP1's auto_wrap_policy (and the checkpointing policy, the same units).
std::string wrap_policy_expr(const WrapPolicyText& wrap) {
  if (wrap.kind == "block")
    return "functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=block_classes(model))";
  if (wrap.kind == "size") return "functools.partial(size_based_auto_wrap_policy, min_num_params=MIN_NUM_PARAMS)";
  return "None";
}

// Checkpointing every wrapped unit: PyTorch's checkpoint_wrapper, applied by
// apply_activation_checkpointing, non-reentrant unless the plan simulated
// reentrant. `target` is the module the wrappers are applied in.
void write_checkpointing(std::ostringstream& py, const Plan& plan, const WrapPolicyText& wrap,
                         const std::string& target) {
  py << "    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
     << "        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)\n";
  if (wrap.kind == "size")
    py << "    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy\n";
  py << "    apply_activation_checkpointing(\n"
     << "        " << target << ",\n"
     << "        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl."
     << (checkpoint_reentrant(plan) ? "REENTRANT" : "NO_REENTRANT") << "),\n";
  if (wrap.kind == "block")
    py << "        check_fn=lambda m: isinstance(m, tuple(block_classes(" << target << "))))\n";
  else
    py << "        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=MIN_NUM_PARAMS))\n";
}

void write_fsdp1(std::ostringstream& py, const Plan& plan, const Candidate& c, const WrapPolicyText& wrap) {
  const char* strategy = c.sharding == Sharding::kZero2   ? "SHARD_GRAD_OP"
                         : c.sharding == Sharding::kZero3 ? "FULL_SHARD"
                         : c.sharding == Sharding::kDdp   ? "NO_SHARD"
                                                          : "HYBRID_SHARD";
  const ojson prefetch = backward_prefetch(plan);
  const DType reduce = reduce_dtype(plan, c);
  std::string mp = "None";
  if (c.precision != Precision::kFp32) {
    const std::string d = py_dtype(compute_dtype(c.precision));
    mp = "MixedPrecision(param_dtype=" + d + ", reduce_dtype=" + py_dtype(reduce) + ", buffer_dtype=" + d;
    if (plan.pytorch_job && plan.pytorch_job->fsdp_keep_low_precision_grads) mp += ", keep_low_precision_grads=True";
    mp += ")";
  } else if (reduce != DType::kF32) {
    mp = "MixedPrecision(reduce_dtype=" + py_dtype(reduce) + ")";
  }
  py << "\n\n"
     << "def fsdp_kwargs(model, device=None):\n"
     << "    \"\"\"FullyShardedDataParallel's keyword arguments, as the plan simulated them.\"\"\"\n"
     << "    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy\n"
     << "    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy\n"
     << "    device = device or local_device()\n"
     << "    kwargs = dict(\n"
     << "        sharding_strategy=ShardingStrategy." << strategy << ",\n"
     << "        auto_wrap_policy=" << wrap_policy_expr(wrap) << ",\n"
     << "        cpu_offload=CPUOffload(offload_params=" << py_bool(c.offload) << "),\n"
     << "        mixed_precision=" << mp << ",\n"
     << "        backward_prefetch="
     << (prefetch.is_null() ? std::string("None") : "BackwardPrefetch." + prefetch.get<std::string>()) << ",\n"
     << "        forward_prefetch=" << py_bool(plan.schedule.prefetch >= 2) << ",\n"
     << "        limit_all_gathers=True,\n"
     << "        device_id=device,\n"
     << "        # Rank 0's weights broadcast at wrap time; FSDP1 does it on the GPU only\n"
     << "        # (on the CPU the ranks must build the same weights, from one seed).\n"
     << "        sync_module_states=device.type != \"cpu\",\n"
     << (planned_orig_params(plan) ? "        use_orig_params=True,  # the original parameters, as planned\n"
                                   : "        use_orig_params=False,  # FlatParameters, as planned\n")
     << "    )\n";
  if (c.sharding == Sharding::kHybrid)
    py << "    # HYBRID_SHARD: sharded within a node, replicated across nodes.\n"
       << "    from torch.distributed.device_mesh import init_device_mesh\n"
       << "    world = torch.distributed.get_world_size()\n"
       << "    kwargs[\"device_mesh\"] = init_device_mesh(device.type, (world // NPROC_PER_NODE, NPROC_PER_NODE),\n"
       << "                                             mesh_dim_names=(\"replicate\", \"shard\"))\n";
  py << "    return kwargs\n\n\n"
     << "def apply(model, device=None):\n"
     << "    \"\"\"The model wrapped in FullyShardedDataParallel" << (c.recompute ? ", its units checkpointed" : "")
     << ".\"\"\"\n"
     << "    from torch.distributed.fsdp import FullyShardedDataParallel\n"
     << "    model = FullyShardedDataParallel(model, **fsdp_kwargs(model, device))\n";
  if (c.recompute) write_checkpointing(py, plan, wrap, "model");
  py << "    return model\n";
}

void write_fsdp2(std::ostringstream& py, const Plan& plan, const Candidate& c, const WrapPolicyText& wrap) {
  const DType reduce = reduce_dtype(plan, c);
  py << "\n\n"
     << "def device_mesh(device_type=None):\n"
     << "    \"\"\"The DeviceMesh fully_shard shards over: "
     << (c.sharding == Sharding::kHybrid ? "(replicate, shard) = (nodes, processes per node)" : "every process")
     << ".\"\"\"\n"
     << "    from torch.distributed.device_mesh import init_device_mesh\n"
     << "    device_type = device_type or local_device().type\n"
     << "    world = torch.distributed.get_world_size()\n";
  if (c.sharding == Sharding::kHybrid)
    py << "    return init_device_mesh(device_type, (world // NPROC_PER_NODE, NPROC_PER_NODE),\n"
       << "                            mesh_dim_names=(\"replicate\", \"shard\"))\n";
  else
    py << "    return init_device_mesh(device_type, (world,))\n";
  py << "\n\n"
     << "def fully_shard_kwargs(mesh):\n"
     << "    \"\"\"fully_shard's keyword arguments, as the plan simulated them.\"\"\"\n"
     << "    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy\n"
     << "    return dict(\n"
     << "        mesh=mesh,\n"
     << "        reshard_after_forward=" << py_bool(c.sharding != Sharding::kZero2) << ",\n";
  if (c.precision != Precision::kFp32)
    py << "        mp_policy=MixedPrecisionPolicy(param_dtype=" << py_dtype(compute_dtype(c.precision))
       << ", reduce_dtype=" << py_dtype(reduce) << "),\n";
  else if (reduce != DType::kF32)
    py << "        mp_policy=MixedPrecisionPolicy(reduce_dtype=" << py_dtype(reduce) << "),\n";
  else
    py << "        mp_policy=MixedPrecisionPolicy(),\n";
  py << "        offload_policy=" << (c.offload ? "CPUOffloadPolicy()" : "OffloadPolicy()") << ",\n"
     << "    )\n\n\n"
     << "def units(model):\n"
     << "    \"\"\"The modules fully_shard is called on before the root, in order.\"\"\"\n";
  if (wrap.kind == "block") {
    py << "    classes = tuple(block_classes(model))\n"
       << "    return [m for m in model.modules() if isinstance(m, classes)]\n";
  } else if (wrap.kind == "size") {
    py << "    # FSDP1's size policy, bottom-up: a module holding more than MIN_NUM_PARAMS\n"
       << "    # parameters not yet in a unit becomes one.\n"
       << "    found = []\n\n"
       << "    def visit(m):\n"
       << "        n = sum(visit(child) for child in m.children())\n"
       << "        n += sum(p.numel() for p in m.parameters(recurse=False))\n"
       << "        # A container without a forward (ModuleList, ModuleDict) cannot be a unit:\n"
       << "        # fully_shard refuses it, so its parameters count toward its parent.\n"
       << "        container = isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))\n"
       << "        if n > MIN_NUM_PARAMS and m is not model and not container:\n"
       << "            found.append(m)\n"
       << "            return 0\n"
       << "        return n\n"
       << "    visit(model)\n"
       << "    return found\n";
  } else {
    py << "    return []\n";
  }
  py << "\n\n"
     << "def apply(model, mesh=None):\n"
     << "    \"\"\"fully_shard on every unit, then on the root" << (c.recompute ? ", the units checkpointed first" : "")
     << "; returns the model.\"\"\"\n"
     << "    from torch.distributed.fsdp import fully_shard\n";
  if (c.recompute) write_checkpointing(py, plan, wrap, "model");
  py << "    kwargs = fully_shard_kwargs(mesh if mesh is not None else device_mesh())\n"
     << "    blocks = units(model)\n"
     << "    for m in blocks:\n"
     << "        fully_shard(m, **kwargs)\n"
     << "    fully_shard(model, **kwargs)\n";
  if (plan.schedule.prefetch >= 2 && wrap.kind == "block") {
    const int n = plan.schedule.prefetch;
    py << "    # --prefetch " << n << ": explicit prefetching, as the plan simulated it.\n"
       << "    for i, block in enumerate(blocks):\n"
       << "        if i + " << n - 1 << " < len(blocks):\n"
       << "            block.set_modules_to_forward_prefetch(blocks[i + 1:i + " << n << "])\n"
       << "        if i >= " << n << ":\n"
       << "            block.set_modules_to_backward_prefetch([blocks[i - j] for j in range(1, " << n + 1
       << ")])\n";
  }
  py << "    return model\n";
}

void write_ddp(std::ostringstream& py, const Plan& plan, const Candidate& c, const WrapPolicyText& wrap) {
  py << "\n\n"
     << "def apply(model, device=None):\n"
     << "    \"\"\"The model on this process's device in DistributedDataParallel"
     << (c.recompute ? ", its units checkpointed" : "") << ".\"\"\"\n"
     << "    from torch.nn.parallel import DistributedDataParallel\n"
     << "    device = device or local_device()\n"
     << "    model = model.to(device)\n";
  if (c.recompute) write_checkpointing(py, plan, wrap, "model");
  py << "    return DistributedDataParallel(model, device_ids=[device] if device.type == \"cuda\" else None,\n"
     << "                                   bucket_cap_mb=" << static_cast<double>(plan.schedule.ddp_bucket_cap_bytes) /
                                                                 (1 << 20)
     << ")\n";
}

// make_optimizer: the plan's optimizer (AdamW, its foreach or fused as simulated; SGD
// for `plan --optimizer sgd`), under ZeroRedundancyOptimizer for zero1.
void write_optimizer(std::ostringstream& py, const Plan& plan, const PlanCandidate& pc) {
  const bool sgd = plan.optimizer == "sgd";
  const std::string cls = sgd ? "torch.optim.SGD" : "torch.optim.AdamW";
  const std::string extra = sgd ? "" : ", " + adamw_keyword(plan, pc).python();
  py << "\n\n"
     << "def make_optimizer(model, **kwargs):\n"
     << "    \"\"\"" << (sgd ? "SGD" : "AdamW") << " as the plan simulated it"
     << (pc.candidate.sharding == Sharding::kZero1 ? ", each rank stepping its partition (ZeroRedundancyOptimizer)"
                                                   : "")
     << "; kwargs: lr and the rest.\"\"\"\n";
  if (pc.candidate.sharding == Sharding::kZero1)
    py << "    from torch.distributed.optim import ZeroRedundancyOptimizer\n"
       << "    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=" << cls << extra << ", **kwargs)\n";
  else
    py << "    return " << cls << "(model.parameters()" << extra << ", **kwargs)\n";
}

}  // namespace

LaunchConfig python_module(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                           const std::string& block_class) {
  const Candidate& c = pc.candidate;
  check_ckpt(c, LaunchFormat::kPython);
  const Family family = family_of(plan, c);
  if (family == Family::kDdp) check_ddp_offload(c, LaunchFormat::kPython);
  std::ostringstream py;
  write_header(py, plan, pc, family, wrap, block_class);
  if (family == Family::kFsdp1) write_fsdp1(py, plan, c, wrap);
  if (family == Family::kFsdp2) write_fsdp2(py, plan, c, wrap);
  if (family == Family::kDdp) write_ddp(py, plan, c, wrap);
  write_optimizer(py, plan, pc);
  LaunchConfig out;
  out.settings["module"] = family == Family::kFsdp1 ? "fsdp1" : family == Family::kFsdp2 ? "fsdp2" : "ddp";
  out.settings["train"] = batch_section(plan, pc);
  out.text = py.str();
  out.notes.push_back("python: import the module, then model = apply(model); optimizer = make_optimizer(model, "
                      "lr=...); batch " +
                      std::to_string(pc.max_batch_per_gpu) + " per process");
  return out;
}

}  // namespace shardfit::planner::launch
