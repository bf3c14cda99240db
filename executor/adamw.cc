#include "executor/adamw.h"

#include <cmath>

namespace shardfit::executor {

AdamW::AdamW(std::vector<torch::Tensor> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {}

void AdamW::step() {
  torch::NoGradGuard no_grad;
  ++step_;
  const auto& o = options_;
  if (exp_avg_.empty()) {  // lazily, as torch.optim does: no state before the first step
    for (const auto& p : params_) {
      exp_avg_.push_back(torch::zeros_like(p, p.options().dtype(torch::kFloat)));
      exp_avg_sq_.push_back(torch::zeros_like(p, p.options().dtype(torch::kFloat)));
    }
  }
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step_)));
  const double step_size = o.lr / bias_correction1;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const auto& g = p.grad();
    if (!g.defined()) continue;
    p.mul_(1.0 - o.lr * o.weight_decay);
    exp_avg_[i].mul_(o.beta1).add_(g, 1.0 - o.beta1);
    exp_avg_sq_[i].mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    auto denom = exp_avg_sq_[i].sqrt();  // the one temporary
    denom.div_(bias_correction2_sqrt).add_(o.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

}  // namespace shardfit::executor
