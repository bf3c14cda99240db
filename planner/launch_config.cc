#include "planner/launch_config.h"

#include <cctype>
#include <sstream>
#include <stdexcept>

#include "planner/launch_config_parts.h"
#include "planner/pytorch_stack.h"

namespace shardfit::planner {
namespace launch {

const char* torch_dtype(DType d) {
  return d == DType::kBF16 ? "bfloat16" : d == DType::kF16 ? "float16" : "float32";
}
const char* torch_dtype(Precision p) { return torch_dtype(compute_dtype(p)); }

DType reduce_dtype(const Plan& plan, const Candidate& c) {
  const DType own = compute_dtype(c.precision);
  return plan.pytorch_job ? parse_fsdp_reduce_dtype(plan.pytorch_job->fsdp_reduce_dtype).value_or(own) : own;
}

bool planned_fsdp2(const Plan& plan) { return plan.pytorch_job && plan.pytorch_job->fsdp_version == 2; }

bool planned_no_shard(const Plan& plan, const Candidate& c) { return plan.pytorch_job && fsdp_no_shard(c); }

bool planned_orig_params(const Plan& plan) { return plan.pytorch_job && plan.pytorch_job->fsdp_use_orig_params; }

bool planned_ddp(const Plan& plan, const Candidate& c) {
  return (c.sharding == Sharding::kDdp && !planned_no_shard(plan, c)) || c.sharding == Sharding::kZero1;
}

ojson backward_prefetch(const Plan& plan) {
  if (!plan.pytorch_job || plan.pytorch_job->fsdp_backward_prefetch == "pre") return "BACKWARD_PRE";
  if (plan.pytorch_job->fsdp_backward_prefetch == "post") return "BACKWARD_POST";
  return nullptr;
}

// `plan --adamw-step`, else its PyTorch's default; a plan from before
// candidates recorded it: the job's.
AdamwKeyword adamw_keyword(const Plan& plan, const PlanCandidate& pc) {
  const std::string step = !pc.adamw_step.empty() ? pc.adamw_step
                           : plan.pytorch_job     ? plan.pytorch_job->adamw_step
                                                  : "";
  if (step == "fused") return {"fused", true};
  return {"foreach", step == "foreach"};
}

std::string adamw_assumed(const Plan& plan, const PlanCandidate& pc) {
  return "the plan assumed torch.optim.AdamW(" + adamw_keyword(plan, pc).python() + ")";
}

void check_ckpt(const Candidate& c, LaunchFormat format) {
  if (c.recompute && c.wrap == "none")
    throw InexpressibleCandidate(
        std::string(launch_format_name(format)) + " cannot express '" + c.to_id() +
        "': checkpointing with wrap=none checkpoints the whole model as one unit");
}

void check_ddp_offload(const Candidate& c, LaunchFormat format) {
  if (c.offload && (c.sharding == Sharding::kDdp || c.sharding == Sharding::kZero1))
    throw InexpressibleCandidate(std::string(launch_format_name(format)) + " cannot express '" + c.to_id() +
                                 "': DistributedDataParallel keeps its parameters on the GPU (no offload); use "
                                 "--format deepspeed (offload_optimizer) or a zero3+offload candidate");
}

ojson batch_section(const Plan& plan, const PlanCandidate& pc) {
  return ojson{{"candidate", pc.id()},
               {"model", plan.model.name},
               {"seq_len", plan.model.seq_len},
               {"batch_size_per_gpu", pc.max_batch_per_gpu},
               {"gradient_accumulation_steps", plan.grad_accum},
               {"world_size", plan.hardware.world_size()},
               {"nnodes", plan.hardware.nodes},
               {"nproc_per_node", plan.hardware.gpus_per_node}};
}

bool checkpoint_reentrant(const Plan& plan) { return plan.pytorch_job && plan.pytorch_job->checkpoint == "reentrant"; }

}  // namespace launch

namespace {

using namespace launch;  // NOLINT(build/namespaces): this file is launch's JSON and YAML half

const char* fsdp_sharding(Sharding s) {
  switch (s) {
    case Sharding::kDdp:
      return "NO_SHARD";
    case Sharding::kZero1:  // callers send zero1 to DDP + ZeroRedundancyOptimizer or DeepSpeed first
      return "";
    case Sharding::kZero2:
      return "SHARD_GRAD_OP";
    case Sharding::kZero3:
      return "FULL_SHARD";
    case Sharding::kHybrid:
      return "HYBRID_SHARD";
  }
  return "";
}

// FSDP's auto_wrap_policy, as data: the policy function's name and argument.
ojson fsdp_wrap_policy(const WrapPolicyText& wrap, const std::string& block_class) {
  if (wrap.kind == "none") return nullptr;
  if (wrap.kind == "block")
    return ojson{{"policy", "transformer_auto_wrap_policy"},
                 {"transformer_layer_cls", ojson::array({block_class})}};
  return ojson{{"policy", "size_based_auto_wrap_policy"}, {"min_num_params", wrap.min_num_params}};
}

ojson checkpointing(const Plan& plan, const Candidate& c, const WrapPolicyText& wrap, const std::string& block_class) {
  ojson ckpt{{"enabled", c.recompute}};
  if (c.recompute) {
    ckpt["function"] = "apply_activation_checkpointing";
    ckpt["checkpoint_wrapper_fn"] = "checkpoint_wrapper";
    ckpt["checkpoint_impl"] = checkpoint_reentrant(plan) ? "REENTRANT" : "NO_REENTRANT";
    ckpt["auto_wrap_policy"] = fsdp_wrap_policy(wrap, block_class);
  }
  return ckpt;
}

// ddp and zero1 under `--format fsdp`: DistributedDataParallel's keyword
// arguments (torch/nn/parallel/distributed.py, PyTorch 2.11), and for zero1
// ZeroRedundancyOptimizer (torch/distributed/optim/zero_redundancy_optimizer.py:
// each rank steps the optimizer over its partition of the parameters,
// PyTorch's ZeRO-1) around torch.optim.AdamW.
LaunchConfig ddp_json(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                      const std::string& block_class) {
  const Candidate& c = pc.candidate;
  LaunchConfig out;
  ojson kwargs{{"device_ids", "[the local rank's device] (None on the CPU)"},
               {"bucket_cap_mb", static_cast<double>(plan.schedule.ddp_bucket_cap_bytes) / (1 << 20)}};
  out.settings["ddp_kwargs"] = kwargs;
  if (c.sharding == Sharding::kZero1) {
    const AdamwKeyword kw = adamw_keyword(plan, pc);
    out.settings["optimizer"] = ojson{{"class", "torch.distributed.optim.ZeroRedundancyOptimizer"},
                                      {"optimizer_class", "torch.optim.AdamW"},
                                      {kw.name, kw.value}};
  }
  if (c.precision != Precision::kFp32)
    out.settings["autocast"] = ojson{{"dtype", torch_dtype(c.precision)}};
  out.settings["activation_checkpointing"] = checkpointing(plan, c, wrap, block_class);
  out.settings["train"] = batch_section(plan, pc);
  out.notes.push_back("fsdp: DistributedDataParallel(model, **ddp_kwargs)" +
                      std::string(c.sharding == Sharding::kZero1 ? " and ZeroRedundancyOptimizer(model.parameters(), "
                                                                   "optimizer_class=torch.optim.AdamW, ...)"
                                                                 : "") +
                      (c.precision != Precision::kFp32 ? "; the forward under torch.autocast(dtype)" : "") +
                      "; --format python writes it as code");
  out.text = out.settings.dump(2) + "\n";
  return out;
}

// A plan made with --fsdp-version 2: FSDP2's fully_shard keyword arguments
// (torch.distributed.fsdp.fully_shard) and the modules to call it on, in
// order, as planner/pytorch_fsdp2.h simulated them. fully_shard reads
// mp_policy.param_dtype (torch 2.11 _fully_shard/_fsdp_param_group.py), so
// a policy it does not need is left out, never null.
LaunchConfig fully_shard(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                         const std::string& block_class) {
  const Candidate& c = pc.candidate;
  ojson kwargs;
  kwargs["reshard_after_forward"] = c.sharding != Sharding::kZero2;
  // HSDP: a 2-D DeviceMesh (init_device_mesh("cuda", (nodes, gpus per node),
  // mesh_dim_names=("replicate", "shard"))), replicated on dim 0.
  if (c.sharding == Sharding::kHybrid)
    kwargs["mesh"] = ojson{{"shape", ojson::array({plan.hardware.nodes, plan.hardware.gpus_per_node})},
                           {"mesh_dim_names", ojson::array({"replicate", "shard"})}};
  const DType reduce = reduce_dtype(plan, c);
  if (c.precision != Precision::kFp32)
    kwargs["mp_policy"] = ojson{{"param_dtype", torch_dtype(c.precision)}, {"reduce_dtype", torch_dtype(reduce)}};
  else if (reduce != DType::kF32)  // MixedPrecisionPolicy(reduce_dtype=...) alone
    kwargs["mp_policy"] = ojson{{"reduce_dtype", torch_dtype(reduce)}};
  if (c.offload) kwargs["offload_policy"] = "CPUOffloadPolicy";
  LaunchConfig out;
  out.settings["fully_shard_kwargs"] = kwargs;
  out.settings["fully_shard_modules"] =
      wrap.kind == "block" ? ojson::array({"every " + block_class, "the root"}) : ojson::array({"the root"});
  out.settings["activation_checkpointing"] = checkpointing(plan, c, wrap, block_class);
  out.settings["train"] = batch_section(plan, pc);
  out.notes.push_back(
      "fsdp: call fully_shard(module, **fully_shard_kwargs) on each of fully_shard_modules in order, building "
      "MixedPrecisionPolicy(param_dtype=torch.<dtype>, ...), CPUOffloadPolicy() and the mesh (init_device_mesh) "
      "from their names (--format python writes it as code); " +
      adamw_assumed(plan, pc));
  // --prefetch N: explicit prefetching, as planner/pytorch_fsdp2.cc simulated
  // it (PyTorch's FSDP2 example's lists).
  if (plan.schedule.prefetch >= 2 && wrap.kind == "block") {
    const int n = plan.schedule.prefetch;
    out.settings["forward_prefetch_blocks"] = n - 1;
    out.settings["backward_prefetch_blocks"] = n;
    out.notes.push_back("fsdp: for each block i of the blocks, in order: if i + " + std::to_string(n - 1) +
                        " < len(blocks), blocks[i].set_modules_to_forward_prefetch(blocks[i+1 : i+" +
                        std::to_string(n) + "]); if i >= " + std::to_string(n) +
                        ", blocks[i].set_modules_to_backward_prefetch([blocks[i-j] for j in 1.." + std::to_string(n) +
                        "])");
  }
  out.text = out.settings.dump(2) + "\n";
  return out;
}

LaunchConfig fsdp(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                  const std::string& block_class) {
  const Candidate& c = pc.candidate;
  check_ckpt(c, LaunchFormat::kFsdp);
  if (planned_ddp(plan, c)) {
    check_ddp_offload(c, LaunchFormat::kFsdp);
    return ddp_json(plan, pc, wrap, block_class);
  }
  if (planned_fsdp2(plan)) return fully_shard(plan, pc, wrap, block_class);
  ojson kwargs;
  kwargs["sharding_strategy"] = fsdp_sharding(c.sharding);
  kwargs["auto_wrap_policy"] = fsdp_wrap_policy(wrap, block_class);
  kwargs["cpu_offload"] = ojson{{"offload_params", c.offload}};
  const DType reduce = reduce_dtype(plan, c);
  if (c.precision == Precision::kFp32) {  // MixedPrecision(reduce_dtype=...) alone, or none
    kwargs["mixed_precision"] = reduce != DType::kF32 ? ojson{{"reduce_dtype", torch_dtype(reduce)}} : ojson(nullptr);
  } else {
    const char* d = torch_dtype(c.precision);
    kwargs["mixed_precision"] = ojson{{"param_dtype", d}, {"reduce_dtype", torch_dtype(reduce)}, {"buffer_dtype", d}};
    if (plan.pytorch_job && plan.pytorch_job->fsdp_keep_low_precision_grads)
      kwargs["mixed_precision"]["keep_low_precision_grads"] = true;
  }
  kwargs["backward_prefetch"] = backward_prefetch(plan);
  // --prefetch 2: a unit ahead in forward too (FSDP1 prefetches one unit
  // each way; deeper backward prefetch is FSDP2's set_modules_to_backward_prefetch).
  kwargs["forward_prefetch"] = plan.schedule.prefetch >= 2;
  kwargs["limit_all_gathers"] = true;
  // The unit's device (FSDP1 moves the module there; on a CPU job,
  // torch.device("cpu")), rank 0's weights broadcast at wrap time, and
  // FlatParameters (use_orig_params=False) unless the plan simulated the
  // original parameters; its AdamW foreach default depends on it
  // (planner/pytorch_stack.h).
  kwargs["device_id"] = "the local rank's device (torch.device('cuda', LOCAL_RANK); torch.device('cpu') on the CPU)";
  kwargs["sync_module_states"] = true;
  kwargs["use_orig_params"] = planned_orig_params(plan);
  if (c.sharding == Sharding::kHybrid)  // HYBRID_SHARD over ("replicate", "shard") = (nodes, GPUs per node)
    kwargs["device_mesh"] = ojson{{"shape", ojson::array({plan.hardware.nodes, plan.hardware.gpus_per_node})},
                                  {"mesh_dim_names", ojson::array({"replicate", "shard"})}};

  LaunchConfig out;
  out.settings["fsdp_kwargs"] = kwargs;
  out.settings["activation_checkpointing"] = checkpointing(plan, c, wrap, block_class);
  out.settings["train"] = batch_section(plan, pc);
  out.notes.push_back(
      "fsdp: build each value from its name: ShardingStrategy[...], CPUOffload(**cpu_offload), "
      "MixedPrecision(param_dtype=torch.<dtype>, ...), BackwardPrefetch[...], "
      "functools.partial(<policy>, ...) for auto_wrap_policy (--format python writes it as code)" +
      (plan.pytorch_job ? "; " + adamw_assumed(plan, pc) : std::string()));
  if (c.precision == Precision::kFp16)
    out.notes.push_back("fsdp: fp16 needs ShardedGradScaler for loss scaling");
  out.text = out.settings.dump(2) + "\n";
  return out;
}

// Accelerate's fsdp_config (Accelerate 1.15). FSDP2: fsdp_version 2 and
// fsdp_reshard_after_forward as a bool. FSDP1: fsdp_reshard_after_forward
// names the ShardingStrategy (what `accelerate config` writes), and
// fsdp_sharding_strategy says it again, because 1.15's launch still sets
// FSDP_SHARDING_STRATEGY (utils/launch.py prepare_multi_gpu_env, default
// FULL_SHARD from commands/launch.py) and FullyShardedDataParallelPlugin
// prefers it: its reshard_after_forward is read only when sharding_strategy
// is unset (utils/dataclasses.py __post_init__, accelerator.py
// prepare_model's "sharding_strategy or reshard_after_forward").
ojson accelerate_fsdp_config(const Plan& plan, const Candidate& c, const WrapPolicyText& wrap,
                             const std::string& block_class) {
  const bool fsdp2 = planned_fsdp2(plan);
  if (fsdp2 && c.sharding == Sharding::kHybrid)
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' planned for FSDP2: its fsdp_config "
                                 "has no HSDP key (the mesh is the script's); use --format python");
  if (fsdp2 && plan.schedule.prefetch >= 2)
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' planned for FSDP2 with --prefetch " +
                                 std::to_string(plan.schedule.prefetch) +
                                 ": its fsdp_config has no key for set_modules_to_forward/backward_prefetch; use "
                                 "--format python");
  // Accelerate builds MixedPrecision from `mixed_precision` alone: every
  // dtype the same, grads upcast.
  const DType reduce = reduce_dtype(plan, c);
  if (plan.pytorch_job && (reduce != compute_dtype(c.precision) ||
                           (c.precision != Precision::kFp32 && plan.pytorch_job->fsdp_keep_low_precision_grads)))
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' as planned (reduce_dtype " +
                                 torch_dtype(reduce) + " or keep_low_precision_grads): its config has no key for "
                                 "them; use --format python");
  ojson fsdp;
  fsdp["fsdp_version"] = fsdp2 ? 2 : 1;
  if (fsdp2) {
    fsdp["fsdp_reshard_after_forward"] = c.sharding == Sharding::kZero3;
  } else {
    fsdp["fsdp_reshard_after_forward"] = fsdp_sharding(c.sharding);
    fsdp["fsdp_sharding_strategy"] = fsdp_sharding(c.sharding);
  }
  if (wrap.kind == "none") {
    fsdp["fsdp_auto_wrap_policy"] = "NO_WRAP";
  } else if (wrap.kind == "block") {
    fsdp["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP";
    fsdp["fsdp_transformer_layer_cls_to_wrap"] = block_class;
  } else {
    fsdp["fsdp_auto_wrap_policy"] = "SIZE_BASED_WRAP";
    fsdp["fsdp_min_num_params"] = wrap.min_num_params;
  }
  fsdp["fsdp_offload_params"] = c.offload;
  // Accelerate's names (accelerate/utils/constants.py FSDP_BACKWARD_PREFETCH):
  // NO_PREFETCH for None. FSDP2 has none of these keys (Accelerate 1.15
  // commands/to_fsdp2.py removes them).
  if (!fsdp2) {
    const ojson prefetch = backward_prefetch(plan);
    fsdp["fsdp_backward_prefetch"] = prefetch.is_null() ? ojson("NO_PREFETCH") : prefetch;
    fsdp["fsdp_forward_prefetch"] = plan.schedule.prefetch >= 2;
    fsdp["fsdp_use_orig_params"] = planned_orig_params(plan);  // as planned (fsdp's use_orig_params)
    fsdp["fsdp_sync_module_states"] = true;
  }
  fsdp["fsdp_cpu_ram_efficient_loading"] = false;
  fsdp["fsdp_activation_checkpointing"] = c.recompute;
  fsdp["fsdp_state_dict_type"] = "SHARDED_STATE_DICT";
  return fsdp;
}

// zero1 under Accelerate: its DeepSpeed integration (distributed_type
// DEEPSPEED, deepspeed_config keys as Accelerate 1.15's
// commands/config/cluster.py asks them and utils/launch.py
// prepare_deepspeed_cmd_env passes them on). With offload_optimizer_device
// cpu, Accelerate swaps a torch Adam/AdamW for DeepSpeed's CPU Adam itself
// (accelerator.py _prepare_deepspeed).
ojson accelerate_deepspeed_config(const Plan& plan, const Candidate& c) {
  ojson ds{{"zero_stage", 1},
           {"offload_optimizer_device", c.offload ? "cpu" : "none"},
           {"offload_param_device", "none"},
           {"gradient_accumulation_steps", plan.grad_accum},
           {"zero3_init_flag", false}};
  if (plan.hardware.nodes > 1) ds["deepspeed_multinode_launcher"] = "standard";
  return ds;
}

LaunchConfig accelerate(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                        const LaunchOptions& options) {
  const Candidate& c = pc.candidate;
  check_ckpt(c, LaunchFormat::kAccelerate);
  if (c.offload && c.sharding == Sharding::kDdp && !planned_no_shard(plan, c))
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() +
                                 "': MULTI_GPU (DistributedDataParallel) has no offload; use a zero3+offload candidate");
  if (plan.hardware.nodes > 1 && options.main_process_ip.empty())
    throw std::invalid_argument("a plan over " + std::to_string(plan.hardware.nodes) +
                                " nodes needs --main-process-ip ADDRESS (the address of the node with machine_rank 0; "
                                "--main-process-port defaults to 29500)");
  LaunchConfig out;
  ojson& s = out.settings;
  s["compute_environment"] = "LOCAL_MACHINE";
  if (c.sharding == Sharding::kDdp && !planned_no_shard(plan, c)) {
    // One process is Accelerate's 'NO' (no distributed wrapper at all).
    s["distributed_type"] = plan.hardware.world_size() > 1 ? "MULTI_GPU" : "NO";
  } else if (c.sharding == Sharding::kZero1) {
    s["distributed_type"] = "DEEPSPEED";
    s["deepspeed_config"] = accelerate_deepspeed_config(plan, c);
  } else {
    s["distributed_type"] = "FSDP";
    s["fsdp_config"] = accelerate_fsdp_config(plan, c, wrap, options.block_class);
  }
  s["machine_rank"] = 0;
  if (plan.hardware.nodes > 1) {
    s["main_process_ip"] = options.main_process_ip;
    s["main_process_port"] = options.main_process_port;
  }
  s["main_training_function"] = "main";
  s["mixed_precision"] = c.precision == Precision::kFp32 ? "no" : precision_name(c.precision);
  s["num_machines"] = plan.hardware.nodes;
  s["num_processes"] = plan.hardware.world_size();
  s["rdzv_backend"] = "static";
  s["same_network"] = true;
  s["use_cpu"] = false;
  std::ostringstream text;
  text << "# shardfit export-config: " << pc.id() << " for " << plan.model.name << ", seq len "
       << plan.model.seq_len << "\n# per-device batch " << pc.max_batch_per_gpu
       << ", gradient accumulation " << plan.grad_accum
       << " (set them in the training script: Accelerate's config has no batch keys)\n";
  if (!planned_ddp(plan, c) && !planned_fsdp2(plan))
    text << "# fsdp_sharding_strategy repeats fsdp_reshard_after_forward: Accelerate 1.15 applies the former for "
            "FSDP1\n";
  const std::string other_ranks =
      plan.hardware.nodes == 2 ? std::string("1") : "1.." + std::to_string(plan.hardware.nodes - 1);
  if (plan.hardware.nodes > 1) text << "# on the other nodes: the same file with machine_rank " << other_ranks << "\n";
  text << to_yaml(s);
  out.text = text.str();
  out.notes.push_back("accelerate: per-device batch " + std::to_string(pc.max_batch_per_gpu) +
                      " and gradient accumulation " + std::to_string(plan.grad_accum) +
                      " go in the training script");
  if (c.recompute && (c.sharding == Sharding::kDdp || c.sharding == Sharding::kZero1))
    out.notes.push_back("accelerate: +ckpt: " + std::string(c.sharding == Sharding::kDdp ? "MULTI_GPU" : "DEEPSPEED") +
                        " has no checkpointing key; call model.gradient_checkpointing_enable() (Hugging Face) or "
                        "checkpoint each unit in the model");
  if (plan.hardware.nodes > 1)
    out.notes.push_back("accelerate: set machine_rank to " + other_ranks +
                        " on the other nodes (or pass --machine_rank to accelerate launch)");
  return out;
}

// +offload under DeepSpeed: offload_optimizer (and at stage 3
// offload_param) with an "optimizer" section, because with offload and a
// client torch optimizer DeepSpeed 0.19.8 raises ZeRORuntimeException unless
// zero_force_ds_cpu_optimizer is false (runtime/engine.py
// _configure_optimizer); the section's AdamW becomes DeepSpeedCPUAdam
// (_configure_basic_optimizer), with torch.optim.AdamW's defaults.
void deepspeed_offload(const Plan& plan, const Candidate& c, int stage, ojson& s, ojson& zero,
                       std::vector<std::string>& notes) {
  const ojson cpu{{"device", "cpu"}, {"pin_memory", true}};
  if (stage == 3) zero["offload_param"] = cpu;
  zero["offload_optimizer"] = cpu;
  s["optimizer"] = ojson{{"type", "AdamW"},
                         {"params", ojson{{"lr", 0.001},
                                          {"betas", ojson::array({0.9, 0.999})},
                                          {"eps", 1e-8},
                                          {"weight_decay", 0.01}}}};
  notes.push_back(
      "deepspeed: +offload: the \"optimizer\" section is AdamW at torch.optim.AdamW's defaults, run as "
      "DeepSpeed's CPU Adam; set its lr and pass no optimizer to deepspeed.initialize");
  if (stage < 3) {
    const double bytes = static_cast<double>(plan.model.params) * dtype_bytes(compute_dtype(c.precision));
    const bool gib = bytes >= static_cast<double>(int64_t{1} << 30);
    std::ostringstream line;
    line.precision(2);
    line << std::fixed << "deepspeed: " << c.to_id() << " differs from the plan: DeepSpeed offloads parameters "
         << "only at stage 3, so stage " << stage << " keeps the full " << precision_name(c.precision)
         << " parameters on every GPU (" << bytes / static_cast<double>(int64_t{1} << (gib ? 30 : 20))
         << (gib ? " GiB" : " MiB") << ") that the plan held on the host; the micro batch "
         << "may not fit (zero3+offload is the plan's meaning)";
    notes.push_back(line.str());
  }
}

LaunchConfig deepspeed(const Plan& plan, const PlanCandidate& pc) {
  const Candidate& c = pc.candidate;
  int stage = 0;
  switch (c.sharding) {
    case Sharding::kDdp:
      stage = 0;
      break;
    case Sharding::kZero1:
      stage = 1;
      break;
    case Sharding::kZero2:
      stage = 2;
      break;
    case Sharding::kZero3:
    case Sharding::kHybrid:
      stage = 3;
      break;
  }
  LaunchConfig out;
  ojson& s = out.settings;
  s["train_micro_batch_size_per_gpu"] = pc.max_batch_per_gpu;
  s["gradient_accumulation_steps"] = plan.grad_accum;
  s["train_batch_size"] =
      pc.max_batch_per_gpu * static_cast<int64_t>(plan.grad_accum) * plan.hardware.world_size();
  ojson zero{{"stage", stage}};
  if (c.sharding == Sharding::kHybrid) {
    // ZeRO++ hpZ (https://www.deepspeed.ai/tutorials/zeropp/): a secondary
    // copy of the parameters sharded within each node serves the backward's
    // gathers. DeepSpeed 0.19.8 removed MiCS, the hierarchical form that
    // replicated across nodes (runtime/config.py _REMOVED_ZERO_CONFIG_KEYS).
    zero["zero_hpz_partition_size"] = plan.hardware.gpus_per_node;
    out.notes.push_back("deepspeed: hybrid is ZeRO++ hpZ (zero_hpz_partition_size " +
                        std::to_string(plan.hardware.gpus_per_node) +
                        "): gradients and optimizer state sharded over all " +
                        std::to_string(plan.hardware.world_size()) +
                        " GPUs, not replicated per node as planned, plus a per-node shard of the parameters; "
                        "at most the plan's memory per GPU, different traffic");
  }
  if (c.offload) deepspeed_offload(plan, c, stage, s, zero, out.notes);
  s["zero_optimization"] = zero;
  s["bf16"] = ojson{{"enabled", c.precision == Precision::kBf16}};
  s["fp16"] = ojson{{"enabled", c.precision == Precision::kFp16}};
  if (c.recompute) {
    s["activation_checkpointing"] = ojson{{"partition_activations", false},
                                          {"cpu_checkpointing", false},
                                          {"contiguous_memory_optimization", false}};
    out.notes.push_back(
        "deepspeed: +ckpt: the model must checkpoint each unit itself "
        "(deepspeed.checkpointing.checkpoint, or Hugging Face gradient_checkpointing_enable())");
  }
  if (stage == 3 && c.wrap != "none")
    out.notes.push_back(
        "deepspeed: ZeRO-3 gathers parameters per module as they are used; "
        "wrap=" +
        c.wrap + " has no DeepSpeed setting (the plan's peak assumed it)");
  out.text = s.dump(2) + "\n";
  return out;
}

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  static const char* kWords[] = {"no",  "yes", "on",  "off",  "true",  "false", "null", "~",
                                 "No",  "Yes", "On",  "Off",  "True",  "False", "Null", "NO",
                                 "YES", "ON",  "OFF", "TRUE", "FALSE", "NULL"};
  for (const char* w : kWords)
    if (s == w) return true;
  if (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '.') return true;
  for (char ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.' ||
          ch == '/'))
      return true;
  return false;
}

std::string yaml_scalar(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!needs_quotes(s)) return s;
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
    return q + "'";
  }
  return v.dump();
}

void emit(std::ostringstream& out, const ojson& v, int indent) {
  const std::string pad(indent, ' ');
  for (auto it = v.begin(); it != v.end(); ++it) {
    const ojson& item = it.value();
    if (item.is_object() && !item.empty()) {
      out << pad << it.key() << ":\n";
      emit(out, item, indent + 2);
    } else if (item.is_array() && !item.empty()) {
      out << pad << it.key() << ":\n";
      for (const ojson& e : item) out << pad << "- " << yaml_scalar(e) << "\n";
    } else if (item.is_object()) {
      out << pad << it.key() << ": {}\n";
    } else if (item.is_array()) {
      out << pad << it.key() << ": []\n";
    } else {
      out << pad << it.key() << ": " << yaml_scalar(item) << "\n";
    }
  }
}

}  // namespace

LaunchFormat parse_launch_format(const std::string& text) {
  if (text == "fsdp") return LaunchFormat::kFsdp;
  if (text == "accelerate") return LaunchFormat::kAccelerate;
  if (text == "deepspeed") return LaunchFormat::kDeepSpeed;
  if (text == "python") return LaunchFormat::kPython;
  throw std::invalid_argument("unknown format '" + text + "' (python, fsdp, accelerate or deepspeed)");
}

const char* launch_format_name(LaunchFormat format) {
  switch (format) {
    case LaunchFormat::kFsdp:
      return "fsdp";
    case LaunchFormat::kAccelerate:
      return "accelerate";
    case LaunchFormat::kDeepSpeed:
      return "deepspeed";
    case LaunchFormat::kPython:
      return "python";
  }
  return "";
}

std::string to_yaml(const nlohmann::ordered_json& value) {
  std::ostringstream out;
  emit(out, value, 0);
  return out.str();
}

LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate, LaunchFormat format,
                                  const LaunchOptions& options) {
  WrapPolicyText wrap;
  const std::string& w = candidate.candidate.wrap;
  if (w == "none" || w == "block") {
    wrap.kind = w;
  } else {
    wrap.kind = "size";
    wrap.min_num_params = std::stoll(w.substr(w.find(':') + 1));
  }
  if (candidate.max_batch_per_gpu < 1)
    throw InexpressibleCandidate("'" + candidate.id() +
                                 "' does not fit batch 1 in the plan: nothing to launch");
  if (format != LaunchFormat::kDeepSpeed && wrap.kind == "block" && options.block_class.empty())
    throw std::invalid_argument("wrap=block needs the model's transformer block class, and '" +
                                plan.model.name + "' is not a model shardfit knows (nor a plan from a trace that "
                                "marks its blocks)");
  if (options.main_process_port < 1 || options.main_process_port > 65535)
    throw std::invalid_argument("main process port " + std::to_string(options.main_process_port) +
                                " is not a TCP port (1..65535)");
  switch (format) {
    case LaunchFormat::kFsdp:
      return fsdp(plan, candidate, wrap, options.block_class);
    case LaunchFormat::kAccelerate:
      return accelerate(plan, candidate, wrap, options);
    case LaunchFormat::kDeepSpeed:
      return deepspeed(plan, candidate);
    case LaunchFormat::kPython:
      return python_module(plan, candidate, wrap, options.block_class);
  }
  return {};
}

LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate, LaunchFormat format,
                                  const std::string& block_class) {
  LaunchOptions options;
  options.block_class = block_class;
  return export_launch_config(plan, candidate, format, options);
}

}  // namespace shardfit::planner
