// BERT (Hugging Face BertForSequenceClassification): names, shapes and
// initialisation as transformers writes them; a two-label sentence-pair
// classification head (GLUE MRPC's shape) with cross-entropy loss.
#include <cmath>

#include "models/layers.h"
#include "models/model.h"

namespace shardfit::models {
namespace {

class BertEmbeddingsImpl : public ModuleBase {
 public:
  BertEmbeddingsImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertEmbeddings"), cfg(c) {
    const double r = c.initializer_range;
    word_embeddings = register_module("word_embeddings", Embedding(c.vocab_size, c.hidden, r, o));
    position_embeddings =
        register_module("position_embeddings", Embedding(c.max_positions, c.hidden, r, o));
    token_type_embeddings =
        register_module("token_type_embeddings", Embedding(c.type_vocab_size, c.hidden, r, o));
    LayerNorm_ = register_module("LayerNorm", LayerNorm(c.hidden, c.layer_norm_eps, o));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& token_types) {
    return call({ids, token_types}, [this](const std::vector<torch::Tensor>& in) {
      auto pos = torch::arange(in[0].size(1), in[0].options()).unsqueeze(0);
      auto x = word_embeddings(in[0]) + token_type_embeddings(in[1]) + position_embeddings(pos);
      return maybe_dropout(LayerNorm_(x), cfg.embd_dropout, is_training());
    });
  }
  ModelConfig cfg;
  Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  LayerNorm LayerNorm_{nullptr};
};
TORCH_MODULE(BertEmbeddings);

class BertSelfAttentionImpl : public ModuleBase {
 public:
  BertSelfAttentionImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertSelfAttention"), cfg(c) {
    query = register_module("query", Linear(c.hidden, c.hidden, c.initializer_range, o));
    key = register_module("key", Linear(c.hidden, c.hidden, c.initializer_range, o));
    value = register_module("value", Linear(c.hidden, c.hidden, c.initializer_range, o));
  }
  // mask_bias: [b, 1, 1, s], 0 where attended, a large negative number elsewhere.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask_bias) {
    return call({x, mask_bias}, [this](const std::vector<torch::Tensor>& in) {
      const auto& h = in[0];
      const int64_t b = h.size(0), s = h.size(1), nh = cfg.heads, hd = cfg.hidden / cfg.heads;
      auto heads = [&](const torch::Tensor& t) { return t.view({b, s, nh, hd}).permute({0, 2, 1, 3}); };
      auto q = heads(query(h)), k = heads(key(h)), v = heads(value(h));
      auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
      auto probs = torch::softmax(scores + in[1], -1);
      probs = maybe_dropout(probs, cfg.attn_dropout, is_training());
      return torch::matmul(probs, v).permute({0, 2, 1, 3}).contiguous().view({b, s, cfg.hidden});
    });
  }
  ModelConfig cfg;
  Linear query{nullptr}, key{nullptr}, value{nullptr};
};
TORCH_MODULE(BertSelfAttention);

// dense -> dropout -> LayerNorm(. + residual): BertSelfOutput and BertOutput.
class BertResidualOutputImpl : public ModuleBase {
 public:
  BertResidualOutputImpl(const std::string& type, int64_t in, const ModelConfig& c,
                         const torch::TensorOptions& o)
      : ModuleBase(type), cfg(c) {
    dense = register_module("dense", Linear(in, c.hidden, c.initializer_range, o));
    LayerNorm_ = register_module("LayerNorm", LayerNorm(c.hidden, c.layer_norm_eps, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual) {
    return call({x, residual}, [this](const std::vector<torch::Tensor>& in) {
      return LayerNorm_(maybe_dropout(dense(in[0]), cfg.hidden_dropout, is_training()) + in[1]);
    });
  }
  ModelConfig cfg;
  Linear dense{nullptr};
  LayerNorm LayerNorm_{nullptr};
};
TORCH_MODULE(BertResidualOutput);

class BertAttentionImpl : public ModuleBase {
 public:
  BertAttentionImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertAttention") {
    self = register_module("self", BertSelfAttention(c, o));
    output = register_module("output", BertResidualOutput("BertSelfOutput", c.hidden, c, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask_bias) {
    return call({x, mask_bias}, [this](const std::vector<torch::Tensor>& in) {
      return output(self(in[0], in[1]), in[0]);
    });
  }
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

class BertIntermediateImpl : public ModuleBase {
 public:
  BertIntermediateImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertIntermediate"), cfg(c) {
    dense = register_module("dense", Linear(c.hidden, c.intermediate, c.initializer_range, o));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return activation(dense(in[0]), cfg.activation);
    });
  }
  ModelConfig cfg;
  Linear dense{nullptr};
};
TORCH_MODULE(BertIntermediate);

class BertLayerImpl : public ModuleBase {
 public:
  BertLayerImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertLayer", /*is_block=*/true) {
    attention = register_module("attention", BertAttention(c, o));
    intermediate = register_module("intermediate", BertIntermediate(c, o));
    output = register_module("output", BertResidualOutput("BertOutput", c.intermediate, c, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask_bias) {
    return call({x, mask_bias}, [this](const std::vector<torch::Tensor>& in) {
      auto a = attention(in[0], in[1]);
      return output(intermediate(a), a);
    });
  }
  BertAttention attention{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

class BertEncoderImpl : public ModuleBase {
 public:
  BertEncoderImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase("BertEncoder") {
    layer = register_module("layer", std::make_shared<ModuleListImpl>());
    for (int64_t i = 0; i < c.layers; ++i)
      layers.push_back(layer->register_module(std::to_string(i), BertLayer(c, o)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask_bias) {
    return call({x, mask_bias}, [this](const std::vector<torch::Tensor>& in) {
      auto h = in[0];
      for (auto& l : layers) h = l(h, in[1]);
      return h;
    });
  }
  std::shared_ptr<ModuleListImpl> layer;
  std::vector<BertLayer> layers;
};
TORCH_MODULE(BertEncoder);

class BertPoolerImpl : public ModuleBase {
 public:
  BertPoolerImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase("BertPooler") {
    dense = register_module("dense", Linear(c.hidden, c.hidden, c.initializer_range, o));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return torch::tanh(dense(in[0].select(1, 0)));
    });
  }
  Linear dense{nullptr};
};
TORCH_MODULE(BertPooler);

class BertModelImpl : public ModuleBase {
 public:
  // `pooling`: BertForMaskedLM builds it without the pooler
  // (add_pooling_layer=False) and reads the sequence output.
  BertModelImpl(const ModelConfig& c, const torch::TensorOptions& o, bool pooling = true)
      : ModuleBase("BertModel") {
    embeddings = register_module("embeddings", BertEmbeddings(c, o));
    encoder = register_module("encoder", BertEncoder(c, o));
    if (pooling) pooler = register_module("pooler", BertPooler(c, o));
  }
  // Returns the pooled [CLS] representation [b, H] (without a pooler: the
  // sequence output [b, s, H]).
  torch::Tensor forward(const Batch& batch) {
    return call({batch.input_ids, batch.token_type_ids, batch.attention_mask},
                [this](const std::vector<torch::Tensor>& in) {
                  auto x = embeddings(in[0], in[1]);
                  // Hugging Face's extended mask, [b,1,1,s]: (1 - mask) * -10000 (transformers
                  // before 4.21; later versions use dtype.min: the same softmax).
                  auto keep = in[2].unsqueeze(1).unsqueeze(2).to(x.scalar_type());
                  auto mask_bias = (1.0 - keep) * -1e4;
                  auto sequence = encoder(x, mask_bias);
                  return pooler ? pooler(sequence) : sequence;
                });
  }
  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};
  BertPooler pooler{nullptr};
};
TORCH_MODULE(BertModel);

class BertForSequenceClassification : public TrainableModel {
 public:
  BertForSequenceClassification(const ModelConfig& c, const torch::TensorOptions& o)
      : TrainableModel("BertForSequenceClassification"), cfg(c) {
    bert = register_module("bert", BertModel(c, o));
    classifier =
        register_module("classifier", Linear(c.hidden, c.num_labels, c.initializer_range, o));
  }
  const ModelConfig& config() const override { return cfg; }
  torch::Tensor forward_loss(const Batch& batch) override {
    return call({batch.input_ids, batch.labels}, [&, this](const std::vector<torch::Tensor>& in) {
      Batch b = batch;
      b.input_ids = in[0];
      auto pooled = maybe_dropout(bert(b), cfg.hidden_dropout, is_training());
      auto logits = classifier(pooled);
      if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
      return torch::nn::functional::cross_entropy(logits, in[1]);
    });
  }
  ModelConfig cfg;
  BertModel bert{nullptr};
  Linear classifier{nullptr};
};

// BertForMaskedLM's head, named as Hugging Face's: cls.predictions.transform
// (dense + activation + LayerNorm), then the vocabulary-wide decoder whose
// weight is the word embeddings' (tie_word_embeddings, HF's default; else
// cls.predictions.decoder.weight of its own) plus cls.predictions.bias.
class BertPredictionHeadTransformImpl : public ModuleBase {
 public:
  BertPredictionHeadTransformImpl(const ModelConfig& c, const torch::TensorOptions& o)
      : ModuleBase("BertPredictionHeadTransform"), cfg(c) {
    dense = register_module("dense", Linear(c.hidden, c.hidden, c.initializer_range, o));
    LayerNorm_ = register_module("LayerNorm", LayerNorm(c.hidden, c.layer_norm_eps, o));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      return LayerNorm_(activation(dense(in[0]), cfg.activation));
    });
  }
  ModelConfig cfg;
  Linear dense{nullptr};
  LayerNorm LayerNorm_{nullptr};
};
TORCH_MODULE(BertPredictionHeadTransform);

// The untied decoder's weight (nn.Linear(hidden, vocab) whose bias is the
// head's): only registered when tie_word_embeddings is false.
class BertDecoderWeightImpl : public ModuleBase {
 public:
  BertDecoderWeightImpl(const ModelConfig& c, const torch::TensorOptions& o) : ModuleBase("Linear") {
    weight = register_parameter("weight", torch::empty({c.vocab_size, c.hidden}, o));
    init_normal(weight, c.initializer_range);
  }
  torch::Tensor weight;
};
TORCH_MODULE(BertDecoderWeight);

class BertLMPredictionHeadImpl : public ModuleBase {
 public:
  BertLMPredictionHeadImpl(const ModelConfig& c, const torch::TensorOptions& o, Embedding words)
      : ModuleBase("BertLMPredictionHead"), cfg(c), words_(std::move(words)) {
    transform = register_module("transform", BertPredictionHeadTransform(c, o));
    if (!c.tie_word_embeddings) decoder = register_module("decoder", BertDecoderWeight(c, o));
    bias = register_parameter("bias", torch::zeros({c.vocab_size}, o));
  }
  std::vector<std::string> borrowed_params() const override {
    if (!cfg.tie_word_embeddings) return {};
    return {words_->path() + ".weight"};
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) {
      const auto& w = cfg.tie_word_embeddings ? words_->weight : decoder->weight;
      return torch::matmul(transform(in[0]), w.t()) + bias;
    });
  }
  ModelConfig cfg;
  BertPredictionHeadTransform transform{nullptr};
  BertDecoderWeight decoder{nullptr};
  torch::Tensor bias;

 private:
  Embedding words_;
};
TORCH_MODULE(BertLMPredictionHead);

class BertOnlyMLMHeadImpl : public ModuleBase {
 public:
  BertOnlyMLMHeadImpl(const ModelConfig& c, const torch::TensorOptions& o, Embedding words)
      : ModuleBase("BertOnlyMLMHead") {
    predictions = register_module("predictions", BertLMPredictionHead(c, o, std::move(words)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call({x}, [this](const std::vector<torch::Tensor>& in) { return predictions(in[0]); });
  }
  BertLMPredictionHead predictions{nullptr};
};
TORCH_MODULE(BertOnlyMLMHead);

class BertForMaskedLM : public TrainableModel {
 public:
  BertForMaskedLM(const ModelConfig& c, const torch::TensorOptions& o)
      : TrainableModel("BertForMaskedLM"), cfg(c) {
    bert = register_module("bert", BertModel(c, o, /*pooling=*/false));
    cls = register_module("cls", BertOnlyMLMHead(c, o, bert->embeddings->word_embeddings));
  }
  const ModelConfig& config() const override { return cfg; }
  // MLM loss: logits over the vocabulary at every position, as Hugging Face
  // computes them; labels are -100 where a token was not masked.
  torch::Tensor forward_loss(const Batch& batch) override {
    return call({batch.input_ids, batch.labels}, [&, this](const std::vector<torch::Tensor>& in) {
      Batch b = batch;
      b.input_ids = in[0];
      auto logits = cls(bert(b));
      if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
      return torch::nn::functional::cross_entropy(logits.view({-1, cfg.vocab_size}), in[1].reshape({-1}));
    });
  }
  ModelConfig cfg;
  BertModel bert{nullptr};
  BertOnlyMLMHead cls{nullptr};
};

}  // namespace

std::shared_ptr<TrainableModel> build_bert(const ModelConfig& c, const torch::TensorOptions& o) {
  if (c.masked_lm()) return std::make_shared<BertForMaskedLM>(c, o);
  return std::make_shared<BertForSequenceClassification>(c, o);
}

std::shared_ptr<TrainableModel> build_gpt2(const ModelConfig& c, const torch::TensorOptions& o);
std::shared_ptr<TrainableModel> build_llama(const ModelConfig& c, const torch::TensorOptions& o);

std::shared_ptr<TrainableModel> build_model(const ModelConfig& c, const torch::TensorOptions& o) {
  auto model = c.family == Family::kGpt2    ? build_gpt2(c, o)
               : c.family == Family::kLlama ? build_llama(c, o)
                                            : build_bert(c, o);
  index_modules(*model);
  model->train();
  return model;
}

}  // namespace shardfit::models
