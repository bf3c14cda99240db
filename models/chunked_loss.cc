#include "models/chunked_loss.h"

namespace shardfit::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kSum = 2;             // at::Reduction::Sum
constexpr int64_t kIgnoreIndex = -100;  // cross_entropy's default

// log_softmax of one chunk's fp32 logits.
torch::Tensor chunk_log_probs(const torch::Tensor& h, const torch::Tensor& weight) {
  auto logits = torch::mm(h, weight.t());
  if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
  return torch::log_softmax(logits, 1);
}

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               int64_t chunk) {
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    const int64_t tokens = hidden.size(0);
    auto total = torch::zeros({}, hidden.options().dtype(torch::kFloat));
    for (int64_t s = 0; s < tokens; s += chunk) {
      const int64_t n = std::min(chunk, tokens - s);
      auto lp = chunk_log_probs(hidden.narrow(0, s, n), weight);
      auto out = std::get<0>(at::nll_loss_forward(lp, targets.narrow(0, s, n), {}, kSum, kIgnoreIndex));
      total.add_(out);
    }
    return total.div_(static_cast<double>(tokens));
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t tokens = hidden.size(0);
    auto scale = grads[0].div(static_cast<double>(tokens));  // d loss / d (sum of token losses)
    auto unused_total_weight = torch::ones({}, scale.options());  // read only under mean reduction
    auto grad_hidden = torch::empty_like(hidden);
    auto grad_weight = torch::zeros_like(weight);
    for (int64_t s = 0; s < tokens; s += chunk) {
      const int64_t n = std::min(chunk, tokens - s);
      const auto h = hidden.narrow(0, s, n);
      auto lp = chunk_log_probs(h, weight);
      auto g = at::nll_loss_backward(scale, lp, targets.narrow(0, s, n), {}, kSum, kIgnoreIndex,
                                     unused_total_weight);
      g = at::_log_softmax_backward_data(g, lp, 1, torch::kFloat);
      lp = torch::Tensor();
      if (weight.scalar_type() != torch::kFloat) g = g.to(weight.scalar_type());
      auto gh = grad_hidden.narrow(0, s, n);
      torch::mm_out(gh, g, weight);
      grad_weight.addmm_(g.t(), h);
    }
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk) {
  return ChunkedCrossEntropy::apply(hidden, weight, targets, chunk);
}

}  // namespace shardfit::models
