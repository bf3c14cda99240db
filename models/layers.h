// The leaf modules the models are built from. Each registers its parameters
// under Hugging Face's names and shapes, can be built directly on any device
// (including kMeta: no initialisation runs there), and runs its forward
// through ModuleBase::call so that wrap policies can make any of them a unit.
#pragma once

#include <torch/torch.h>

#include "models/module_base.h"

namespace shardfit::models {

// Hugging Face initialisation: normal(0, std) weights, zero biases. Skipped on
// the meta device, where there is no data.
void init_normal(torch::Tensor& t, double std);

// GPT-2's Conv1D: y = x @ W + b with W of shape [in, out] (transposed
// relative to nn.Linear), as Hugging Face stores it.
class Conv1DImpl : public ModuleBase {
 public:
  Conv1DImpl(int64_t in, int64_t out, double init_std, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

// nn.Linear: y = x @ W^T + b with W of shape [out, in]; bias=false registers
// no bias (Llama's projections).
class LinearImpl : public ModuleBase {
 public:
  LinearImpl(int64_t in, int64_t out, double init_std, const torch::TensorOptions& opts,
             bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Linear);

class LayerNormImpl : public ModuleBase {
 public:
  LayerNormImpl(int64_t dim, double eps, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

class EmbeddingImpl : public ModuleBase {
 public:
  EmbeddingImpl(int64_t num, int64_t dim, double init_std, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

// Training-mode dropout through native_dropout, whose saved mask is one byte
// per element on every device (plain at::dropout saves a float noise tensor
// on CPU but a byte mask on CUDA: the planner could not predict both).
torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training);

// Activations: "gelu_new" is GPT-2's tanh approximation (one fused kernel,
// the same function Hugging Face computes with five elementwise ops),
// "gelu" is BERT's erf form.
torch::Tensor activation(const torch::Tensor& x, const std::string& kind);

}  // namespace shardfit::models
