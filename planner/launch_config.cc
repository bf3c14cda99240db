#include "planner/launch_config.h"

#include <cctype>
#include <sstream>
#include <stdexcept>

#include "planner/pytorch_stack.h"

namespace shardfit::planner {
namespace {

using ojson = nlohmann::ordered_json;

// A candidate's wrap= part: "none", "block" or "size" with its threshold.
struct WrapPolicyText {
  std::string kind;
  int64_t min_num_params = 0;
};

const char* fsdp_sharding(Sharding s, LaunchFormat format, const std::string& id) {
  switch (s) {
    case Sharding::kDdp:
      return "NO_SHARD";
    case Sharding::kZero1:
      throw InexpressibleCandidate(
          std::string(launch_format_name(format)) + " cannot express '" + id +
          "': FSDP has no optimizer-only sharding (use --format deepspeed, ZeRO stage 1)");
    case Sharding::kZero2:
      return "SHARD_GRAD_OP";
    case Sharding::kZero3:
      return "FULL_SHARD";
    case Sharding::kHybrid:
      return "HYBRID_SHARD";
  }
  return "";
}

const char* torch_dtype(DType d) {
  return d == DType::kBF16 ? "bfloat16" : d == DType::kF16 ? "float16" : "float32";
}
const char* torch_dtype(Precision p) { return torch_dtype(compute_dtype(p)); }

// The reduce_dtype the plan simulated: the plan's fsdp_reduce_dtype, or with
// none given ("param") the candidate's own dtype.
DType reduce_dtype(const Plan& plan, const Candidate& c) {
  const DType own = compute_dtype(c.precision);
  return plan.pytorch_job ? parse_fsdp_reduce_dtype(plan.pytorch_job->fsdp_reduce_dtype).value_or(own) : own;
}

// FSDP's auto_wrap_policy, as data: the policy function's name and argument.
ojson fsdp_wrap_policy(const WrapPolicyText& wrap, const std::string& block_class) {
  if (wrap.kind == "none") return nullptr;
  if (wrap.kind == "block")
    return ojson{{"policy", "transformer_auto_wrap_policy"},
                 {"transformer_layer_cls", ojson::array({block_class})}};
  return ojson{{"policy", "size_based_auto_wrap_policy"}, {"min_num_params", wrap.min_num_params}};
}

void check_ckpt(const Candidate& c, LaunchFormat format) {
  if (c.recompute && c.wrap == "none")
    throw InexpressibleCandidate(
        std::string(launch_format_name(format)) + " cannot express '" + c.to_id() +
        "': checkpointing with wrap=none checkpoints the whole model as one unit");
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

bool planned_fsdp2(const Plan& plan) { return plan.pytorch_job && plan.pytorch_job->fsdp_version == 2; }

// FSDP1's BackwardPrefetch member as the plan simulated it (`plan
// --fsdp-backward-prefetch`; BACKWARD_PRE, the export's choice for shardfit's
// own plans, which prefetch one unit), or null for none.
ojson backward_prefetch(const Plan& plan) {
  if (!plan.pytorch_job || plan.pytorch_job->fsdp_backward_prefetch == "pre") return "BACKWARD_PRE";
  if (plan.pytorch_job->fsdp_backward_prefetch == "post") return "BACKWARD_POST";
  return nullptr;
}

// The optimizer a --stack pytorch plan simulated for the candidate (`plan
// --adamw-step`, else its PyTorch's default; a plan from before candidates
// recorded it: the job's).
std::string adamw_assumed(const Plan& plan, const PlanCandidate& pc) {
  const bool foreach = pc.adamw_foreach ? *pc.adamw_foreach : plan.pytorch_job && plan.pytorch_job->adamw_foreach;
  return std::string("the plan assumed torch.optim.AdamW(foreach=") + (foreach ? "True" : "False") + ")";
}

// A plan made with --fsdp-version 2: FSDP2's fully_shard keyword arguments
// (torch.distributed.fsdp.fully_shard) and the modules to call it on, in
// order, as planner/pytorch_fsdp2.h simulated them.
LaunchConfig fully_shard(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                         const std::string& block_class) {
  const Candidate& c = pc.candidate;
  if (c.sharding != Sharding::kZero2 && c.sharding != Sharding::kZero3 && c.sharding != Sharding::kHybrid)
    throw InexpressibleCandidate("fsdp cannot express '" + c.to_id() +
                                 "' as fully_shard: FSDP2 is zero2, zero3 or hybrid (HSDP)");
  ojson kwargs;
  kwargs["reshard_after_forward"] = c.sharding != Sharding::kZero2;
  // HSDP: a 2-D DeviceMesh (init_device_mesh("cuda", (nodes, gpus per node),
  // mesh_dim_names=("replicate", "shard"))), replicated on dim 0.
  if (c.sharding == Sharding::kHybrid)
    kwargs["mesh"] = ojson{{"shape", ojson::array({plan.hardware.nodes, plan.hardware.gpus_per_node})},
                           {"mesh_dim_names", ojson::array({"replicate", "shard"})}};
  const DType reduce = reduce_dtype(plan, c);
  if (c.precision == Precision::kFp32) {  // MixedPrecisionPolicy(reduce_dtype=...) alone, or none
    kwargs["mp_policy"] = reduce != DType::kF32 ? ojson{{"reduce_dtype", torch_dtype(reduce)}} : ojson(nullptr);
  } else {
    kwargs["mp_policy"] = ojson{{"param_dtype", torch_dtype(c.precision)}, {"reduce_dtype", torch_dtype(reduce)}};
  }
  kwargs["offload_policy"] = c.offload ? ojson("CPUOffloadPolicy") : ojson(nullptr);
  LaunchConfig out;
  out.settings["fully_shard_kwargs"] = kwargs;
  out.settings["fully_shard_modules"] =
      wrap.kind == "block" ? ojson::array({"every " + block_class, "the root"}) : ojson::array({"the root"});
  out.settings["train"] = batch_section(plan, pc);
  out.notes.push_back(
      "fsdp: call fully_shard(module, **fully_shard_kwargs) on each of fully_shard_modules in order, building "
      "MixedPrecisionPolicy(param_dtype=torch.<dtype>, ...), CPUOffloadPolicy() and the mesh (init_device_mesh) "
      "from their names; " +
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
  if (planned_fsdp2(plan)) return fully_shard(plan, pc, wrap, block_class);
  ojson kwargs;
  kwargs["sharding_strategy"] = fsdp_sharding(c.sharding, LaunchFormat::kFsdp, c.to_id());
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

  LaunchConfig out;
  out.settings["fsdp_kwargs"] = kwargs;
  ojson ckpt{{"enabled", c.recompute}};
  if (c.recompute) {
    ckpt["function"] = "apply_activation_checkpointing";
    ckpt["checkpoint_wrapper_fn"] = "checkpoint_wrapper";
    ckpt["auto_wrap_policy"] = fsdp_wrap_policy(wrap, block_class);
  }
  out.settings["activation_checkpointing"] = ckpt;
  out.settings["train"] = batch_section(plan, pc);
  out.notes.push_back(
      "fsdp: build each value from its name: ShardingStrategy[...], CPUOffload(**cpu_offload), "
      "MixedPrecision(param_dtype=torch.<dtype>, ...), BackwardPrefetch[...], "
      "functools.partial(<policy>, ...) for auto_wrap_policy" +
      (plan.pytorch_job ? "; " + adamw_assumed(plan, pc) : std::string()));
  if (c.precision == Precision::kFp16)
    out.notes.push_back("fsdp: fp16 needs ShardedGradScaler for loss scaling");
  out.text = out.settings.dump(2) + "\n";
  return out;
}

LaunchConfig accelerate(const Plan& plan, const PlanCandidate& pc, const WrapPolicyText& wrap,
                        const std::string& block_class) {
  const Candidate& c = pc.candidate;
  check_ckpt(c, LaunchFormat::kAccelerate);
  ojson fsdp;
  fsdp["fsdp_sharding_strategy"] = fsdp_sharding(c.sharding, LaunchFormat::kAccelerate, c.to_id());
  if (wrap.kind == "none") {
    fsdp["fsdp_auto_wrap_policy"] = "NO_WRAP";
  } else if (wrap.kind == "block") {
    fsdp["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP";
    fsdp["fsdp_transformer_layer_cls_to_wrap"] = block_class;
  } else {
    fsdp["fsdp_auto_wrap_policy"] = "SIZE_BASED_WRAP";
    fsdp["fsdp_min_num_params"] = wrap.min_num_params;
  }
  // Accelerate's FSDP2 (fsdp_version 2): reshard_after_forward in place of
  // the sharding strategy; FSDP1's prefetch and flat-parameter keys unused.
  const bool fsdp2 = planned_fsdp2(plan);
  fsdp["fsdp_offload_params"] = c.offload;
  // Accelerate's names (accelerate/utils/constants.py FSDP_BACKWARD_PREFETCH):
  // NO_PREFETCH for None.
  if (!fsdp2) fsdp["fsdp_backward_prefetch"] = backward_prefetch(plan).is_null() ? ojson("NO_PREFETCH")
                                                                                  : backward_prefetch(plan);
  // Accelerate builds MixedPrecision from `mixed_precision` alone: every
  // dtype the same, grads upcast.
  const DType reduce = reduce_dtype(plan, c);
  if (plan.pytorch_job && (reduce != compute_dtype(c.precision) ||
                           (c.precision != Precision::kFp32 && plan.pytorch_job->fsdp_keep_low_precision_grads)))
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' as planned (reduce_dtype " +
                                 torch_dtype(reduce) + " or keep_low_precision_grads): its config has no key for "
                                 "them; use --format fsdp");
  fsdp["fsdp_activation_checkpointing"] = c.recompute;
  if (!fsdp2) {
    fsdp["fsdp_forward_prefetch"] = plan.schedule.prefetch >= 2;
    fsdp["fsdp_sync_module_states"] = true;
    fsdp["fsdp_use_orig_params"] = true;
  }
  fsdp["fsdp_state_dict_type"] = "SHARDED_STATE_DICT";
  if (fsdp2 && c.sharding == Sharding::kHybrid)
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' planned for FSDP2: its fsdp_config "
                                 "has no HSDP key (the mesh is the script's); use --format fsdp");
  if (fsdp2 && plan.schedule.prefetch >= 2)
    throw InexpressibleCandidate("accelerate cannot express '" + c.to_id() + "' planned for FSDP2 with --prefetch " +
                                 std::to_string(plan.schedule.prefetch) +
                                 ": its fsdp_config has no key for set_modules_to_forward/backward_prefetch; use "
                                 "--format fsdp");
  if (fsdp2) {
    fsdp.erase("fsdp_sharding_strategy");
    fsdp["fsdp_version"] = 2;
    fsdp["fsdp_reshard_after_forward"] = c.sharding == Sharding::kZero3;
  }

  LaunchConfig out;
  ojson& s = out.settings;
  s["compute_environment"] = "LOCAL_MACHINE";
  s["distributed_type"] = "FSDP";
  s["fsdp_config"] = fsdp;
  s["machine_rank"] = 0;
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
       << " (set them in the training script: Accelerate's config has no batch keys)\n"
       << to_yaml(s);
  out.text = text.str();
  out.notes.push_back("accelerate: per-device batch " + std::to_string(pc.max_batch_per_gpu) +
                      " and gradient accumulation " + std::to_string(plan.grad_accum) +
                      " go in the training script");
  return out;
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
      stage = 3;
      break;
    case Sharding::kHybrid:
      throw InexpressibleCandidate("deepspeed cannot express '" + c.to_id() +
                                   "': ZeRO has no hybrid sharding (sharded within a node, "
                                   "replicated across nodes); use --format fsdp or accelerate");
  }
  LaunchConfig out;
  ojson& s = out.settings;
  s["train_micro_batch_size_per_gpu"] = pc.max_batch_per_gpu;
  s["gradient_accumulation_steps"] = plan.grad_accum;
  s["train_batch_size"] =
      pc.max_batch_per_gpu * static_cast<int64_t>(plan.grad_accum) * plan.hardware.world_size();
  ojson zero{{"stage", stage}};
  if (c.offload) {
    const ojson cpu{{"device", "cpu"}, {"pin_memory", true}};
    if (stage == 3) zero["offload_param"] = cpu;
    zero["offload_optimizer"] = cpu;
  }
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
  if (c.offload)
    out.notes.push_back(
        "deepspeed: offload_optimizer expects DeepSpeed's CPU Adam (an "
        "\"optimizer\" section) or zero_force_ds_cpu_optimizer: false");
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
  throw std::invalid_argument("unknown format '" + text + "' (fsdp, accelerate or deepspeed)");
}

const char* launch_format_name(LaunchFormat format) {
  switch (format) {
    case LaunchFormat::kFsdp:
      return "fsdp";
    case LaunchFormat::kAccelerate:
      return "accelerate";
    case LaunchFormat::kDeepSpeed:
      return "deepspeed";
  }
  return "";
}

std::string to_yaml(const nlohmann::ordered_json& value) {
  std::ostringstream out;
  emit(out, value, 0);
  return out.str();
}

LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate,
                                  LaunchFormat format, const std::string& block_class) {
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
  if (format != LaunchFormat::kDeepSpeed && wrap.kind == "block" && block_class.empty())
    throw std::invalid_argument("wrap=block needs the model's transformer block class, and '" +
                                plan.model.name + "' is not a model shardfit knows (nor a plan from a trace that "
                                "marks its blocks)");
  switch (format) {
    case LaunchFormat::kFsdp:
      return fsdp(plan, candidate, wrap, block_class);
    case LaunchFormat::kAccelerate:
      return accelerate(plan, candidate, wrap, block_class);
    case LaunchFormat::kDeepSpeed:
      return deepspeed(plan, candidate);
  }
  return {};
}

}  // namespace shardfit::planner
