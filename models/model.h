// The models shardfit plans and trains: GPT-2 (causal LM, tied output
// embedding) and BERT (two-label sentence-pair classification), written to
// match Hugging Face's parameter names, shapes and initialisation, so a
// consolidated checkpoint loads in `transformers`.
//
// One definition serves the planner (built and traced on the meta device)
// and the executor (built on CPU or CUDA): build_model() constructs the
// parameters directly with the target TensorOptions; nothing is built on the
// CPU and moved.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "models/model_config.h"
#include "models/module_base.h"

namespace shardfit::models {

// One batch. GPT-2 reads input_ids (labels are the same ids, shifted inside
// the loss). BERT reads input_ids, token_type_ids, attention_mask and labels.
struct Batch {
  torch::Tensor input_ids;       // [b, s] int64
  torch::Tensor token_type_ids;  // [b, s] int64 (bert)
  torch::Tensor attention_mask;  // [b, s] int64, 1 = attend (bert)
  torch::Tensor labels;          // [b] int64 (bert); undefined for gpt2
  int64_t tokens() const { return input_ids.numel(); }
};

class TrainableModel : public ModuleBase {
 public:
  using ModuleBase::ModuleBase;
  // Forward and loss (mean over the batch) in one call, as training uses it.
  virtual torch::Tensor forward_loss(const Batch& batch) = 0;
  virtual const ModelConfig& config() const = 0;
};

// Builds the model with parameters created by `opts` (device and dtype),
// initialised as Hugging Face does unless the device is meta, and indexed
// (index_modules). Training mode.
std::shared_ptr<TrainableModel> build_model(const ModelConfig& config,
                                            const torch::TensorOptions& opts);

// Sum of numel over named_parameters() (each tied parameter once).
int64_t count_parameters(torch::nn::Module& model);

}  // namespace shardfit::models
