// From a plan to a launch: one planned candidate translated into the settings
// the user's own training stack reads (`shardfit export-config`).
//
//  - python:     a Python module the training script imports: apply(model)
//                builds PyTorch's own objects (FullyShardedDataParallel with
//                ShardingStrategy / MixedPrecision / CPUOffload / the wrap
//                policy; FSDP2's fully_shard with MixedPrecisionPolicy /
//                CPUOffloadPolicy on a DeviceMesh; DistributedDataParallel,
//                with ZeroRedundancyOptimizer for zero1) and make_optimizer
//                the optimizer the plan simulated.
//  - fsdp:       the same keyword arguments by name, as JSON
//                (torch.distributed.fsdp.FullyShardedDataParallel, PyTorch
//                2.11: https://pytorch.org/docs/2.11/fsdp.html; a plan made
//                with `--stack pytorch --fsdp-version 2`: fully_shard's, with
//                the modules to call it on; ddp and zero1:
//                DistributedDataParallel's and ZeroRedundancyOptimizer's).
//  - accelerate: an Accelerate config YAML for `accelerate launch
//                --config_file` (Accelerate 1.15: commands/config/config_args.py
//                ClusterConfig; FSDP keys as utils/launch.py
//                prepare_multi_gpu_env turns them into FSDP_* variables).
//  - deepspeed:  a ds_config.json (DeepSpeed 0.19.8:
//                https://www.deepspeed.ai/docs/config-json/,
//                deepspeed/runtime/config.py DeepSpeedConfig).
//
// The mapping, per part of a candidate id:
//
//  sharding  python / fsdp            accelerate               deepspeed
//  ddp       DistributedDataParallel  MULTI_GPU ('NO' alone)   stage 0
//  zero1     DDP + ZeroRedundancy-    DEEPSPEED, zero_stage 1  stage 1
//            Optimizer(AdamW)
//  zero2     SHARD_GRAD_OP / FSDP2    FSDP, SHARD_GRAD_OP      stage 2
//            reshard_after_forward=F  (FSDP2: false)
//  zero3     FULL_SHARD / FSDP2 True  FSDP, FULL_SHARD (true)  stage 3
//  hybrid    HYBRID_SHARD on a        FSDP1 HYBRID_SHARD       stage 3 + MiCS,
//            (nodes, gpus) mesh /     (FSDP2: refused, no      mics_shard_size =
//            FSDP2 HSDP mesh          mesh key)                GPUs per node
//  +offload  CPUOffload(offload_      fsdp_offload_params      offload_optimizer cpu
//            params=True) / FSDP2     (DEEPSPEED: offload_     (+ offload_param cpu
//            CPUOffloadPolicy;        optimizer_device cpu)    at stage 3) and an
//            ddp/zero1: refused                                AdamW optimizer section
//  +ckpt     apply_activation_checkpointing on the wrapped units (python, fsdp);
//            fsdp_activation_checkpointing (accelerate FSDP); deepspeed and
//            accelerate DEEPSPEED: the model must checkpoint (a note says so)
//  fp32      no MixedPrecision / 'no' / bf16 and fp16 disabled
//  bf16/fp16 MixedPrecision(param, reduce, buffer dtype) / MixedPrecisionPolicy;
//            mixed_precision bf16, fp16; bf16.enabled / fp16.enabled
//  wrap      transformer_auto_wrap_policy with the model's block class /
//            size_based_auto_wrap_policy(min_num_params N) / none; accelerate
//            TRANSFORMER_BASED_WRAP / SIZE_BASED_WRAP / NO_WRAP; DeepSpeed has
//            none (ZeRO-3 gathers per module on use; a note says so)
//
// +offload means what the plan simulated: parameters, gradients and
// optimizer state on the host, the step on the CPU. FSDP's CPU offload and
// DeepSpeed's stage 3 offload_param + offload_optimizer say exactly that.
// DeepSpeed offloads parameters only at stage 3, so its zero1/zero2+offload
// keeps the full parameters on every GPU: exported, with a note giving the
// bytes per GPU the plan did not count.
//
// Every FSDP1 target gets backward prefetch as the plan simulated it
// (BACKWARD_PRE for shardfit's own plans) and limit_all_gathers true, and
// device_id (the local rank's device), sync_module_states true and
// use_orig_params as the plan simulated it (false, its FlatParameters, unless
// planned with --fsdp-use-orig-params).
// The batch is the candidate's max batch per GPU and the plan's grad accum.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner/plan_output.h"

namespace shardfit::planner {

enum class LaunchFormat : uint8_t { kFsdp, kAccelerate, kDeepSpeed, kPython };

// "fsdp" | "accelerate" | "deepspeed" | "python"; throws std::invalid_argument otherwise.
LaunchFormat parse_launch_format(const std::string& text);
const char* launch_format_name(LaunchFormat format);

// A candidate the target cannot express: one line saying why.
struct InexpressibleCandidate : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct LaunchConfig {
  // The target's settings as JSON (for accelerate, what the YAML says).
  nlohmann::ordered_json settings;
  std::string text;                // what the target reads (JSON, YAML or Python), trailing newline
  std::vector<std::string> notes;  // what the user must still do, for stderr
};

struct LaunchOptions {
  // The Hugging Face class of the model's transformer block (GPT2Block,
  // BertLayer); needed only for wrap=block, may be empty otherwise.
  std::string block_class;
  // A plan over several nodes: the address and port of the node with
  // machine_rank 0, which Accelerate's config must name (its
  // main_process_ip / main_process_port). The address has no default.
  std::string main_process_ip;
  int main_process_port = 29500;  // torchrun's default MASTER_PORT
};

// Throws InexpressibleCandidate (see the table above), or
// std::invalid_argument when wrap=block and block_class is empty, or when a
// plan over several nodes is exported for Accelerate without main_process_ip.
LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate, LaunchFormat format,
                                  const LaunchOptions& options);
LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate,
                                  LaunchFormat format, const std::string& block_class);

// YAML for a JSON object of objects, arrays and scalars (strings quoted when
// YAML would read them as something else, e.g. 'no').
std::string to_yaml(const nlohmann::ordered_json& value);

}  // namespace shardfit::planner
