// The llama family (Hugging Face LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM): one implementation, the three differing only in config
// (biases, tied output head, rotary base and scaling). Parameter names,
// shapes and initialisation follow transformers' modeling_llama.py; the
// computation follows its eager path op for op where memory depends on it:
// RMSNorm in fp32, rotary embeddings by rotate_half, keys and values repeated
// to every query head (repeat_kv) before the score matmul, softmax in fp32.
#include <cmath>
#include <limits>

#include "models/attention.h"
#include "models/chunked_loss.h"
#include "models/layers.h"
#include "models/model.h"

namespace shardfit::models {
namespace {

// The prefix transformers gives the family's classes ("LlamaDecoderLayer").
std::string class_prefix(const ModelConfig& c) {
  if (c.model_type == "qwen2") return "Qwen2";
  if (c.model_type == "mistral") return "Mistral";
  return "Llama";
}

// Rotary inverse frequencies theta^(-2i/d), then Llama 3.1's rescaling
// (transformers' _compute_llama3_parameters): wavelengths longer than
// original_max / low_freq_factor are divided by factor, shorter than
// original_max / high_freq_factor kept, those between interpolated.
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t d = c.head_dim_or_default();
  std::vector<float> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
    if (c.rope_factor > 0) {
      const double old_len = static_cast<double>(c.rope_original_max_positions);
      const double low_wavelen = old_len / c.rope_low_freq_factor;
      const double high_wavelen = old_len / c.rope_high_freq_factor;
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= c.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - c.rope_low_freq_factor) /
                              (c.rope_high_freq_factor - c.rope_low_freq_factor);
        f = (1 - smooth) * f / c.rope_factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

// RMSNorm: weight * (x / sqrt(mean(x^2) + eps)), statistics in fp32.
class RMSNormImpl : public ModuleBase {
 public:
  RMSNormImpl(const std::string& prefix, int64_t dim, double eps_, const torch::TensorOptions& o)
      : ModuleBase(prefix + "RMSNorm"), eps(eps_) {
    weight = register_parameter("weight", torch::ones({dim}, o));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      const auto dtype = in[0].scalar_type();
      auto h = in[0].to(torch::kFloat);
      auto var = h.pow(2).mean(-1, /*keepdim=*/true);
      h = h * torch::rsqrt(var + eps);
      return weight * h.to(dtype);
    });
  }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// The second half of the head dimension, negated, then the first half.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

class AttentionImpl : public ModuleBase {
 public:
  AttentionImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase(class_prefix(c) + "Attention"), cfg(c) {
    const int64_t hd = c.head_dim_or_default(), q = c.heads * hd, kv = c.kv_heads_or_heads() * hd;
    const double std = c.initializer_range;
    q_proj = register_module("q_proj", Linear(c.hidden, q, std, o, c.qkv_bias));
    k_proj = register_module("k_proj", Linear(c.hidden, kv, std, o, c.qkv_bias));
    v_proj = register_module("v_proj", Linear(c.hidden, kv, std, o, c.qkv_bias));
    o_proj = register_module("o_proj", Linear(q, c.hidden, std, o, c.o_bias));
  }
  // x: [b, s, H]; cos, sin: [s, head_dim]; future: [s, s] bool, true where a
  // position may NOT attend.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& future) {
    return call({x, cos, sin, future}, [this](const std::vector<torch::Tensor>& in) {
      const int64_t b = in[0].size(0), s = in[0].size(1), hd = cfg.head_dim_or_default();
      const int64_t nh = cfg.heads, nkv = cfg.kv_heads_or_heads(), rep = nh / nkv;
      auto heads = [&](const torch::Tensor& t, int64_t n) {
        return t.view({b, s, n, hd}).transpose(1, 2);  // [b, n, s, hd]
      };
      auto rope = [&](const torch::Tensor& t) { return t * in[1] + rotate_half(t) * in[2]; };
      auto q = rope(heads(q_proj(in[0]), nh));
      auto k = rope(heads(k_proj(in[0]), nkv));
      auto v = heads(v_proj(in[0]), nkv);
      // repeat_kv: every query head gets its group's keys and values, a real
      // copy of [b, heads, s, hd] each (transformers' eager attention).
      auto repeat = [&](const torch::Tensor& t) {
        if (rep == 1) return t;
        return t.unsqueeze(2).expand({b, nkv, rep, s, hd}).reshape({b, nh, s, hd});
      };
      k = repeat(k);
      v = repeat(v);
      // transformers' LlamaSdpaAttention: repeat_kv, no mask, is_causal
      if (fused_attention(cfg)) {
        auto y = fused_attention(cfg, q, k, v, is_training() ? cfg.attn_dropout : 0.0);
        y = y.transpose(1, 2).contiguous();
        return o_proj(y.view({b, s, nh * hd}));
      }
      auto w = torch::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
      w = w.masked_fill(in[3], -std::numeric_limits<float>::infinity());
      w = torch::softmax(w, -1, torch::kFloat).to(q.scalar_type());
      w = maybe_dropout(w, cfg.attn_dropout, is_training());
      auto y = torch::matmul(w, v).transpose(1, 2).contiguous().view({b, s, nh * hd});
      return o_proj(y);
    });
  }
  ModelConfig cfg;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

// SwiGLU: down(silu(gate(x)) * up(x)).
class MLPImpl : public ModuleBase {
 public:
  MLPImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase(class_prefix(c) + "MLP") {
    const double std = c.initializer_range;
    gate_proj = register_module("gate_proj", Linear(c.hidden, c.intermediate, std, o, false));
    up_proj = register_module("up_proj", Linear(c.hidden, c.intermediate, std, o, false));
    down_proj = register_module("down_proj", Linear(c.intermediate, c.hidden, std, o, false));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return down_proj(torch::silu(gate_proj(in[0])) * up_proj(in[0]));
    });
  }
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public ModuleBase {
 public:
  DecoderLayerImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase(class_prefix(c) + "DecoderLayer", /*is_block=*/true) {
    self_attn = register_module("self_attn", Attention(c, o));
    mlp = register_module("mlp", MLP(c, o));
    input_layernorm =
        register_module("input_layernorm", RMSNorm(class_prefix(c), c.hidden, c.layer_norm_eps, o));
    post_attention_layernorm = register_module(
        "post_attention_layernorm", RMSNorm(class_prefix(c), c.hidden, c.layer_norm_eps, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& future) {
    return call({x, cos, sin, future}, [this](const std::vector<torch::Tensor>& in) {
      auto h = in[0] + self_attn(input_layernorm(in[0]), in[1], in[2], in[3]);
      return h + mlp(post_attention_layernorm(h));
    });
  }
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

class DecoderModelImpl : public ModuleBase {
 public:
  DecoderModelImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase(class_prefix(c) + "Model"), cfg(c), inv_freq(rope_inv_freq(c)) {
    embed_tokens =
        register_module("embed_tokens", Embedding(c.vocab_size, c.hidden, c.initializer_range, o));
    layers = register_module("layers", std::make_shared<ModuleListImpl>());
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(layers->register_module(std::to_string(i), DecoderLayer(c, o)));
    norm = register_module("norm", RMSNorm(class_prefix(c), c.hidden, c.layer_norm_eps, o));
  }
  // ids: [b, s] -> final hidden states [b, s, H].
  torch::Tensor forward(const torch::Tensor& ids) {
    return call({ids}, [this](const std::vector<torch::Tensor>& in) {
      const int64_t s = in[0].size(1);
      auto x = embed_tokens(in[0]);
      // cos and sin of every position's rotation angles, [s, head_dim] in
      // the compute dtype, made once per step and shared by every layer.
      const auto f32 = x.options().dtype(torch::kFloat);
      const int64_t n = static_cast<int64_t>(inv_freq.size());
      torch::Tensor inv;
      if (x.is_meta()) {
        inv = torch::empty({n}, f32);
      } else {
        auto host = torch::from_blob(inv_freq.data(), {n}, torch::kFloat);
        inv = x.is_cpu() ? host.clone() : host.to(x.device());
      }
      auto angles = torch::outer(torch::arange(s, f32), inv);
      auto emb = torch::cat({angles, angles}, -1);
      auto cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
      auto future = torch::ones({s, s}, in[0].options().dtype(torch::kBool)).triu(1);
      for (auto& block : blocks) x = block(x, cos, sin, future);
      return norm(x);
    });
  }
  ModelConfig cfg;
  std::vector<float> inv_freq;
  Embedding embed_tokens{nullptr};
  std::shared_ptr<ModuleListImpl> layers;
  std::vector<DecoderLayer> blocks;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(DecoderModel);

// lm_head: its own [vocab, hidden] weight, or with tie_word_embeddings none
// (model.embed_tokens.weight, borrowed). Gives the logits, or under
// `--loss chunked:N` the loss without them (models/chunked_loss.h).
class LMHeadImpl : public ModuleBase {
 public:
  LMHeadImpl(const ModelConfig& c, Embedding embed, const torch::TensorOptions& o)
      : ModuleBase("Linear"), embed_(std::move(embed)) {
    if (!c.tie_word_embeddings) {
      own_ = register_parameter("weight", torch::empty({c.vocab_size, c.hidden}, o));
      init_normal(own_, c.initializer_range);
    }
  }
  std::vector<std::string> borrowed_params() const override {
    if (own_.defined()) return {};
    return {embed_->path() + ".weight"};
  }
  // hidden [b, s, H] -> logits [b, s, V].
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return torch::matmul(in[0], weight().t());
    });
  }
  // hidden [b, s, H], targets [b*s] -> mean cross-entropy, `chunk` tokens at a time.
  torch::Tensor chunked_loss(const torch::Tensor& x, const torch::Tensor& targets, int64_t chunk) {
    return call({x, targets}, [this, chunk](const std::vector<torch::Tensor>& in) {
      return chunked_cross_entropy(in[0].reshape({-1, in[0].size(-1)}), weight(), in[1], chunk);
    });
  }

 private:
  const torch::Tensor& weight() const { return own_.defined() ? own_ : embed_->weight; }
  Embedding embed_;
  torch::Tensor own_;
};
TORCH_MODULE(LMHead);

class CausalLM : public TrainableModel {
 public:
  CausalLM(const ModelConfig& c, const torch::TensorOptions& o)
      : TrainableModel(class_prefix(c) + "ForCausalLM"), cfg(c) {
    model = register_module("model", DecoderModel(c, o));
    lm_head = register_module("lm_head", LMHead(c, model->embed_tokens, o));
  }
  const ModelConfig& config() const override { return cfg; }

  // Causal LM loss as GPT-2's: logits for the first s-1 positions, in fp32;
  // or chunked (ModelConfig::loss_chunk), never the whole logits matrix.
  torch::Tensor forward_loss(const Batch& batch) override {
    return call({batch.input_ids}, [this](const std::vector<torch::Tensor>& in) {
      const auto& ids = in[0];
      const int64_t s = ids.size(1);
      auto hidden = model(ids).narrow(1, 0, s - 1);
      auto targets = ids.narrow(1, 1, s - 1).reshape({-1});
      if (cfg.loss_chunk > 0) return lm_head->chunked_loss(hidden, targets, cfg.loss_chunk);
      auto logits = lm_head(hidden);
      if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
      return torch::nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets);
    });
  }
  ModelConfig cfg;
  DecoderModel model{nullptr};
  LMHead lm_head{nullptr};
};

}  // namespace

std::shared_ptr<TrainableModel> build_llama(const ModelConfig& c, const torch::TensorOptions& o) {
  return std::make_shared<CausalLM>(c, o);
}

}  // namespace shardfit::models
