// GPT-2 (Hugging Face GPT2LMHeadModel): names, shapes and initialisation as
// transformers writes them; causal LM loss; output embedding tied to wte
// unless the config says tie_word_embeddings: false.
#include <cmath>

#include "models/attention.h"
#include "models/layers.h"
#include "models/model.h"

namespace shardfit::models {
namespace {

class GPT2AttentionImpl : public ModuleBase {
 public:
  GPT2AttentionImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("GPT2Attention"), cfg(c) {
    c_attn = register_module("c_attn", Conv1D(c.hidden, 3 * c.hidden, c.initializer_range, o));
    // GPT-2's scaled init of residual projections: std / sqrt(2 * n_layer).
    c_proj = register_module(
        "c_proj", Conv1D(c.hidden, c.hidden, c.initializer_range / std::sqrt(2.0 * c.layers), o));
  }
  // x: [b, s, H]; future: [s, s] bool, true where a position may NOT attend.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& future) {
    return call({x, future}, [this](const std::vector<torch::Tensor>& in) {
      const auto& h = in[0];
      const int64_t b = h.size(0), s = h.size(1), nh = cfg.heads, hd = cfg.hidden / cfg.heads;
      auto qkv = c_attn(h).split(cfg.hidden, /*dim=*/2);
      auto heads = [&](const torch::Tensor& t) { return t.view({b, s, nh, hd}).permute({0, 2, 1, 3}); };
      auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
      if (fused_attention(cfg)) {  // transformers' GPT2SdpaAttention: no mask, is_causal
        auto y = fused_attention(cfg, q, k, v, is_training() ? cfg.attn_dropout : 0.0);
        y = y.transpose(1, 2).contiguous();
        return maybe_dropout(c_proj(y.view({b, s, cfg.hidden})), cfg.hidden_dropout, is_training());
      }
      auto w = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
      w = w.masked_fill(in[1], -std::numeric_limits<float>::infinity());
      w = torch::softmax(w, -1);
      w = maybe_dropout(w, cfg.attn_dropout, is_training());
      auto y = torch::matmul(w, v).permute({0, 2, 1, 3}).contiguous().view({b, s, cfg.hidden});
      return maybe_dropout(c_proj(y), cfg.hidden_dropout, is_training());
    });
  }
  ModelConfig cfg;
  Conv1D c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GPT2Attention);

class GPT2MLPImpl : public ModuleBase {
 public:
  GPT2MLPImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase("GPT2MLP"), cfg(c) {
    c_fc = register_module("c_fc", Conv1D(c.hidden, c.intermediate, c.initializer_range, o));
    c_proj = register_module(
        "c_proj",
        Conv1D(c.intermediate, c.hidden, c.initializer_range / std::sqrt(2.0 * c.layers), o));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      auto h = activation(c_fc(in[0]), cfg.activation);
      return maybe_dropout(c_proj(h), cfg.hidden_dropout, is_training());
    });
  }
  ModelConfig cfg;
  Conv1D c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GPT2MLP);

class GPT2BlockImpl : public ModuleBase {
 public:
  GPT2BlockImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("GPT2Block", /*is_block=*/true) {
    ln_1 = register_module("ln_1", LayerNorm(c.hidden, c.layer_norm_eps, o));
    attn = register_module("attn", GPT2Attention(c, o));
    ln_2 = register_module("ln_2", LayerNorm(c.hidden, c.layer_norm_eps, o));
    mlp = register_module("mlp", GPT2MLP(c, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& future) {
    return call({x, future}, [this](const std::vector<torch::Tensor>& in) {
      auto h = in[0] + attn(ln_1(in[0]), in[1]);
      return h + mlp(ln_2(h));
    });
  }
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};
};
TORCH_MODULE(GPT2Block);

class GPT2ModelImpl : public ModuleBase {
 public:
  GPT2ModelImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("GPT2Model"), cfg(c) {
    wte = register_module("wte", Embedding(c.vocab_size, c.hidden, c.initializer_range, o));
    wpe = register_module("wpe", Embedding(c.max_positions, c.hidden, c.initializer_range, o));
    h = register_module("h", std::make_shared<ModuleListImpl>());
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(h->register_module(std::to_string(i), GPT2Block(c, o)));
    ln_f = register_module("ln_f", LayerNorm(c.hidden, c.layer_norm_eps, o));
  }
  // ids: [b, s] -> final hidden states [b, s, H].
  torch::Tensor forward(const torch::Tensor& ids) {
    return call({ids}, [this](const std::vector<torch::Tensor>& in) {
      const int64_t s = in[0].size(1);
      auto opts_long = in[0].options();
      auto pos = torch::arange(s, opts_long).unsqueeze(0);
      // One [s, s] causal mask per step, shared by every layer (Hugging Face
      // keeps an n_positions² byte buffer in each layer instead).
      auto future = torch::ones({s, s}, opts_long.dtype(torch::kBool)).triu(1);
      auto x = maybe_dropout(wte(in[0]) + wpe(pos), cfg.embd_dropout, is_training());
      for (auto& block : blocks) x = block(x, future);
      return ln_f(x);
    });
  }
  ModelConfig cfg;
  Embedding wte{nullptr}, wpe{nullptr};
  std::shared_ptr<ModuleListImpl> h;
  std::vector<GPT2Block> blocks;
  LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

// lm_head owns no parameter: its weight is transformer.wte.weight.
class TiedLMHeadImpl : public ModuleBase {
 public:
  explicit TiedLMHeadImpl(Embedding wte) : ModuleBase("Linear"), wte_(std::move(wte)) {}
  std::vector<std::string> borrowed_params() const override { return {wte_->path() + ".weight"}; }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return torch::matmul(in[0], wte_->weight.t());
    });
  }

 private:
  Embedding wte_;
};
TORCH_MODULE(TiedLMHead);

// tie_word_embeddings: false: lm_head owns its weight, as Hugging Face's
// nn.Linear(n_embd, vocab_size, bias=False), normal(0, initializer_range).
class UntiedLMHeadImpl : public ModuleBase {
 public:
  UntiedLMHeadImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase("Linear") {
    weight = register_parameter("weight", torch::empty({c.vocab_size, c.hidden}, o));
    init_normal(weight, c.initializer_range);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) { return torch::matmul(in[0], weight.t()); });
  }
  torch::Tensor weight;
};
TORCH_MODULE(UntiedLMHead);

class GPT2LMHeadModel : public TrainableModel {
 public:
  GPT2LMHeadModel(const ModelConfig& c, const torch::TensorOptions& o)
      : TrainableModel("GPT2LMHeadModel"), cfg(c) {
    transformer = register_module("transformer", GPT2Model(c, o));
    if (c.tie_word_embeddings)
      lm_head = register_module("lm_head", TiedLMHead(transformer->wte));
    else
      untied_lm_head = register_module("lm_head", UntiedLMHead(c, o));
  }
  const ModelConfig& config() const override { return cfg; }

  // Causal LM loss: position t predicts token t+1. Logits are computed for
  // the first s-1 positions only and upcast to fp32 for the loss (the same
  // loss as Hugging Face's shift-then-contiguous, without the logits copy).
  torch::Tensor forward_loss(const Batch& batch) override {
    return call({batch.input_ids}, [this](const std::vector<torch::Tensor>& in) {
      const auto& ids = in[0];
      const int64_t s = ids.size(1);
      auto hidden = transformer(ids);
      auto last = hidden.narrow(1, 0, s - 1);
      auto logits = cfg.tie_word_embeddings ? lm_head(last) : untied_lm_head(last);
      auto targets = ids.narrow(1, 1, s - 1).reshape({-1});
      if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
      return torch::nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets);
    });
  }
  ModelConfig cfg;
  GPT2Model transformer{nullptr};
  TiedLMHead lm_head{nullptr};
  UntiedLMHead untied_lm_head{nullptr};  // registered as "lm_head" when untied
};

}  // namespace

std::shared_ptr<TrainableModel> build_gpt2(const ModelConfig& c, const torch::TensorOptions& o) {
  return std::make_shared<GPT2LMHeadModel>(c, o);
}

}  // namespace shardfit::models
