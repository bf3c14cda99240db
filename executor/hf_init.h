// `run --init PATH`: start training from a Hugging Face checkpoint. PATH is
// a `.safetensors` file, or a directory holding `model.safetensors` or
// `model.safetensors.index.json` (its weight_map naming each tensor's shard
// file). Stored F32, BF16 or F16 tensors are converted to the fp32 master.
//
// Each rank reads only the elements its own shards hold (HfCheckpoint::read
// from FlatParam's constructor, one ranged read per shard piece, through a
// host buffer of that piece's stored bytes): under zero2/zero3/hybrid no rank
// reads, or ever holds, the whole model; ddp and zero1 hold every parameter
// on every rank anyway and read it all. The model itself is built on the
// meta device (no bytes) when a checkpoint initialises it.
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

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model_config.h"

namespace shardfit::executor {

// Checks the checkpoint's headers against `model`'s parameters (names,
// shapes, dtypes, byte ranges). `model` may be on the meta device. With
// `verify_data`, every byte of data is read and checked, as `shardfit
// verify` does: a file that carries shardfit's XXH3 checksums (`run
// --export` writes them) against them, a file without (Hugging Face's own)
// for values no trained weight holds (NaN, Inf). A flipped bit, an edited
// tensor or a NaN is an error naming the file and the tensor, before any
// rank starts. Returns the files whose data had no checksums to check (only
// their values were), for the caller to say so.
std::vector<std::string> check_hf_checkpoint(const std::string& path, torch::nn::Module& model,
                                             bool verify_data = false);
// The same against `config`'s model, built on the meta device.
std::vector<std::string> check_hf_checkpoint(const std::string& path, const models::ModelConfig& config,
                                             bool verify_data = false);

// A checkpoint checked against a model, read piece by piece.
class HfCheckpoint {
 public:
  // check_hf_checkpoint's checks; `model` may be on the meta device.
  HfCheckpoint(const std::string& path, torch::nn::Module& model);
  ~HfCheckpoint();
  HfCheckpoint(const HfCheckpoint&) = delete;
  HfCheckpoint& operator=(const HfCheckpoint&) = delete;

  // Elements [offset, offset + dst.numel()) of parameter `name` (its
  // model name), flattened in row-major order, read from the file and
  // converted into `dst` (contiguous; any floating dtype, any device).
  void read(const std::string& name, int64_t offset, const torch::Tensor& dst);
  // Data bytes read so far, and every parameter's stored bytes.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t data_bytes() const { return data_bytes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t bytes_read_ = 0;
  int64_t data_bytes_ = 0;
};

}  // namespace shardfit::executor
