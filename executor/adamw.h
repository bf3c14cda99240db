// AdamW with decoupled weight decay, step for step what torch.optim.AdamW
// (single-tensor path) computes, over whatever tensors it is given: whole
// parameters for one rank, flat shards under ZeRO.
//
// Memory, which the planner charges the same way: state (exp_avg,
// exp_avg_sq) is created lazily at the first step, 2 × the tensor's bytes in
// fp32; each update allocates one temporary the size of the tensor (the
// denominator sqrt(v)) and frees it before the next tensor.
#pragma once

#include <vector>

#include <torch/torch.h>

namespace shardfit::executor {

struct AdamWOptions {
  double lr = 6e-4;           // nanoGPT/llm.c's GPT-2 small learning rate
  double beta1 = 0.9;         // torch.optim.AdamW defaults below
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW {
 public:
  AdamW(std::vector<torch::Tensor> params, AdamWOptions options);
  // Updates every parameter that has a gradient.
  void step();
  int64_t steps() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  // State tensors (for checkpoints and tests): exp_avg[i], exp_avg_sq[i].
  std::vector<torch::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<torch::Tensor>& exp_avg_sq() { return exp_avg_sq_; }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace shardfit::executor
