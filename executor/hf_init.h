// `run --init PATH`: start training from a Hugging Face checkpoint. PATH is
// a `.safetensors` file, or a directory holding `model.safetensors` or
// `model.safetensors.index.json` (its weight_map naming each tensor's shard
// file). Stored F32, BF16 or F16 tensors are converted to the fp32 master.
//
// Every tensor is read with a ranged read of exactly its bytes (the headers
// say where), one tensor at a time through a buffer of that tensor's size.
// The names must be the model's parameter names (a tied output head is one
// parameter, stored once, as `--export` writes it); a GPT-2 checkpoint
// saved from the base model (`h.0.attn...` without `transformer.`) is
// accepted too, as transformers' base_model_prefix rule does.
//
// Errors are std::invalid_argument, one line naming the path and the tensor:
// a missing or extra name, a wrong shape, a dtype other than F32/BF16/F16,
// a header that does not parse, data offsets outside the file.
#pragma once

#include <torch/torch.h>

#include <string>

#include "models/model_config.h"

namespace shardfit::executor {

// Checks the checkpoint's headers against `model`'s parameters (names,
// shapes, dtypes, byte ranges) without reading tensor data. `model` may be
// on the meta device.
void check_hf_checkpoint(const std::string& path, torch::nn::Module& model);
// The same against `config`'s model, built on the meta device.
void check_hf_checkpoint(const std::string& path, const models::ModelConfig& config);

// check_hf_checkpoint, then copies every stored tensor into its parameter.
void load_hf_checkpoint(const std::string& path, torch::nn::Module& model);

}  // namespace shardfit::executor
