#include "models/autograd_hooks.h"

#include <stdexcept>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

namespace shardfit::models {
namespace {

using torch::autograd::variable_list;

class AccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatedHook(std::function<void()> cb) : cb_(std::move(cb)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    cb_();
    return outputs;
  }

 private:
  std::function<void()> cb_;
};

class CallbackNode final : public torch::autograd::Node {
 public:
  explicit CallbackNode(std::function<void()> cb) : cb_(std::move(cb)) {}
  variable_list apply(variable_list&& grads) override {
    if (cb_) cb_();
    return std::move(grads);
  }
  std::string name() const override { return "shardfit::BackwardCallback"; }

 private:
  std::function<void()> cb_;
};

class CheckpointNode final : public torch::autograd::Node {
 public:
  CheckpointNode(std::vector<torch::Tensor> inputs, std::vector<bool> needs_grad, ModuleFn fn,
                 std::function<void(bool)> on_recompute)
      : inputs_(std::move(inputs)),
        needs_grad_(std::move(needs_grad)),
        fn_(std::move(fn)),
        on_recompute_(std::move(on_recompute)) {}

  variable_list apply(variable_list&& grads) override {
    torch::AutoGradMode grad_on(true);
    std::vector<torch::Tensor> xs;
    xs.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      auto d = inputs_[i].detach();
      if (needs_grad_[i]) d.requires_grad_(true);
      xs.push_back(d);
    }
    inputs_.clear();  // the recomputation owns them now
    if (on_recompute_) on_recompute_(true);
    torch::Tensor y = fn_(xs);
    if (on_recompute_) on_recompute_(false);
    torch::autograd::backward({y}, {grads[0]});
    y = torch::Tensor();
    variable_list out;
    for (size_t i = 0; i < xs.size(); ++i)
      if (needs_grad_[i]) out.push_back(xs[i].grad());
    return out;
  }
  std::string name() const override { return "shardfit::CheckpointBackward"; }

 private:
  std::vector<torch::Tensor> inputs_;
  std::vector<bool> needs_grad_;
  ModuleFn fn_;
  std::function<void(bool)> on_recompute_;
};

bool needs(const torch::Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

std::vector<torch::Tensor> with_backward_callback(const std::vector<torch::Tensor>& tensors,
                                                  std::function<void()> on_backward) {
  if (!torch::GradMode::is_enabled()) return tensors;
  std::vector<torch::Tensor> grad_inputs;
  for (const auto& t : tensors)
    if (needs(t)) grad_inputs.push_back(t);
  if (grad_inputs.empty()) return tensors;
  auto node = std::shared_ptr<CallbackNode>(new CallbackNode(std::move(on_backward)),
                                            torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(grad_inputs));
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!needs(t)) {
      out.push_back(t);
      continue;
    }
    torch::Tensor alias = t.detach();  // shares the storage: no allocation
    torch::autograd::create_gradient_edge(alias, node);
    out.push_back(alias);
  }
  return out;
}

std::shared_ptr<torch::autograd::Node> after_grad_accumulated(const torch::Tensor& param,
                                                              std::function<void()> on_accumulated) {
  if (!param.is_leaf() || !param.requires_grad())
    throw std::invalid_argument("after_grad_accumulated: not a leaf tensor that requires grad");
  std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(param);
  node->add_post_hook(std::make_unique<AccumulatedHook>(std::move(on_accumulated)));
  return node;
}

torch::Tensor checkpoint(const std::vector<torch::Tensor>& inputs, ModuleFn fn,
                         std::function<void(bool)> on_recompute) {
  std::vector<bool> needs_grad;
  std::vector<torch::Tensor> grad_inputs;
  for (const auto& t : inputs) {
    needs_grad.push_back(needs(t));
    if (needs(t)) grad_inputs.push_back(t);
  }
  if (!torch::GradMode::is_enabled() || grad_inputs.empty()) return fn(inputs);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = fn(inputs);
  }
  std::vector<torch::Tensor> saved;
  for (const auto& t : inputs) saved.push_back(t.detach());
  auto node = std::shared_ptr<CheckpointNode>(
      new CheckpointNode(std::move(saved), std::move(needs_grad), std::move(fn),
                         std::move(on_recompute)),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(grad_inputs));
  torch::autograd::create_gradient_edge(y, node);
  return y;
}

}  // namespace shardfit::models
