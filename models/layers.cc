#include "models/layers.h"

#include <cmath>

namespace shardfit::models {
namespace {
thread_local ModuleRunner* g_runner = nullptr;

bool has_data(const torch::Tensor& t) { return !t.is_meta(); }
}  // namespace

ModuleRunner* current_runner() { return g_runner; }
ScopedModuleRunner::ScopedModuleRunner(ModuleRunner* runner) : previous_(g_runner) {
  g_runner = runner;
}
ScopedModuleRunner::~ScopedModuleRunner() { g_runner = previous_; }

void index_modules(torch::nn::Module& root) {
  int index = 0;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (auto* m = dynamic_cast<ModuleBase*>(item.value().get())) {
      m->index_ = index;
      m->path_ = item.key();
    }
    ++index;
  }
}

void init_normal(torch::Tensor& t, double std) {
  if (!has_data(t)) return;
  torch::NoGradGuard no_grad;
  t.normal_(0.0, std);
}

Conv1DImpl::Conv1DImpl(int64_t in, int64_t out, double init_std, const torch::TensorOptions& opts)
    : ModuleBase("Conv1D") {
  weight = register_parameter("weight", torch::empty({in, out}, opts));
  bias = register_parameter("bias", torch::zeros({out}, opts));
  init_normal(weight, init_std);
}

torch::Tensor Conv1DImpl::forward(const torch::Tensor& x) {
  return call({x}, [this](const std::vector<torch::Tensor>& in) {
    const auto& t = in[0];
    auto sizes = t.sizes().vec();
    sizes.back() = weight.size(1);
    return torch::addmm(bias, t.reshape({-1, t.size(-1)}), weight).view(sizes);
  });
}

LinearImpl::LinearImpl(int64_t in, int64_t out, double init_std, const torch::TensorOptions& opts,
                       bool with_bias)
    : ModuleBase("Linear") {
  weight = register_parameter("weight", torch::empty({out, in}, opts));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}, opts));
  init_normal(weight, init_std);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return call({x}, [this](const std::vector<torch::Tensor>& in) {
    return bias.defined() ? torch::linear(in[0], weight, bias) : torch::linear(in[0], weight);
  });
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_, const torch::TensorOptions& opts)
    : ModuleBase("LayerNorm"), eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, opts));
  bias = register_parameter("bias", torch::zeros({dim}, opts));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return call({x}, [this](const std::vector<torch::Tensor>& in) {
    return torch::layer_norm(in[0], {weight.size(0)}, weight, bias, eps);
  });
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim, double init_std,
                             const torch::TensorOptions& opts)
    : ModuleBase("Embedding") {
  weight = register_parameter("weight", torch::empty({num, dim}, opts));
  init_normal(weight, init_std);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return call({ids}, [this](const std::vector<torch::Tensor>& in) {
    return torch::embedding(weight, in[0]);
  });
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  return std::get<0>(at::native_dropout(x, p, /*train=*/true));
}

torch::Tensor activation(const torch::Tensor& x, const std::string& kind) {
  return kind == "gelu" ? torch::gelu(x) : torch::gelu(x, "tanh");
}

int64_t count_parameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

}  // namespace shardfit::models
