// From a plan to a launch: one planned candidate translated into the settings
// the user's own training stack reads (`shardfit export-config`).
//
//  - fsdp:       PyTorch FSDP constructor keyword arguments, as JSON
//                (torch.distributed.fsdp.FullyShardedDataParallel, PyTorch
//                2.x: https://pytorch.org/docs/stable/fsdp.html), plus how to
//                apply activation checkpointing and the batch to train.
//                A plan made with `--stack pytorch --fsdp-version 2`: FSDP2's
//                `fully_shard` keyword arguments (reshard_after_forward,
//                mp_policy, offload_policy) and the modules to call it on;
//                its accelerate export `fsdp_version: 2` with
//                `fsdp_reshard_after_forward` (Accelerate 1.6's FSDP2 keys).
//  - accelerate: an Accelerate config YAML for `accelerate launch
//                --config_file` (`distributed_type: FSDP`, `fsdp_config` keys
//                as https://huggingface.co/docs/accelerate/usage_guides/fsdp
//                and https://huggingface.co/docs/transformers/fsdp list them).
//  - deepspeed:  a ds_config.json (https://www.deepspeed.ai/docs/config-json/:
//                `zero_optimization.stage`, `offload_param`,
//                `offload_optimizer`, batch keys, `bf16` / `fp16`).
//
// The mapping, per part of a candidate id:
//
//  sharding  fsdp / accelerate                 deepspeed
//  ddp       NO_SHARD                          stage 0
//  zero1     refused (FSDP has no              stage 1
//            optimizer-only sharding)
//  zero2     SHARD_GRAD_OP                     stage 2
//  zero3     FULL_SHARD                        stage 3
//  hybrid    HYBRID_SHARD                      refused (ZeRO has no replicas
//                                              across nodes of a sharded group)
//  +offload  cpu_offload.offload_params /      zero1/2: offload_optimizer cpu
//            fsdp_offload_params: true         zero3: + offload_param cpu
//  +ckpt     apply_activation_checkpointing    activation_checkpointing section
//            on the wrapped units /            (the model must call DeepSpeed's
//            fsdp_activation_checkpointing     checkpoint per block; a note says so)
//  fp32      mixed_precision null / 'no'       bf16 and fp16 disabled
//  bf16/fp16 MixedPrecision(param, reduce,     bf16.enabled / fp16.enabled (fp32
//            buffer dtype) / bf16, fp16        master weights are DeepSpeed's default)
//  wrap=none auto_wrap_policy null / NO_WRAP   (no equivalent: DeepSpeed gathers per
//  block     transformer_auto_wrap_policy with  module on use; a note says the plan
//            the model's block class /         assumed shardfit's units)
//            TRANSFORMER_BASED_WRAP
//  size:N    size_based_auto_wrap_policy,
//            min_num_params N / SIZE_BASED_WRAP
//
// Every target also gets backward prefetch BACKWARD_PRE and (fsdp)
// limit_all_gathers true: the simulator prefetches the next unit in backward
// and holds at most one prefetched gather, which is what those settings do.
// The batch is the candidate's max batch per GPU and the plan's grad accum.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner/plan_output.h"

namespace shardfit::planner {

enum class LaunchFormat : uint8_t { kFsdp, kAccelerate, kDeepSpeed };

// "fsdp" | "accelerate" | "deepspeed"; throws std::invalid_argument otherwise.
LaunchFormat parse_launch_format(const std::string& text);
const char* launch_format_name(LaunchFormat format);

// A candidate the target cannot express: one line saying why.
struct InexpressibleCandidate : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct LaunchConfig {
  // The target's settings as JSON (for accelerate, what the YAML says).
  nlohmann::ordered_json settings;
  std::string text;                // what the target reads (JSON or YAML), trailing newline
  std::vector<std::string> notes;  // what the user must still do, for stderr
};

// `block_class` is the Hugging Face class of the model's transformer block
// (GPT2Block, BertLayer); it is needed only for wrap=block and may be empty
// otherwise. Throws InexpressibleCandidate (see the table above), or
// std::invalid_argument when wrap=block and block_class is empty.
LaunchConfig export_launch_config(const Plan& plan, const PlanCandidate& candidate,
                                  LaunchFormat format, const std::string& block_class);

// YAML for a JSON object of objects, arrays and scalars (strings quoted when
// YAML would read them as something else, e.g. 'no').
std::string to_yaml(const nlohmann::ordered_json& value);

}  // namespace shardfit::planner
