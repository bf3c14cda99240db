#include "models/hf_architecture.h"

#include <filesystem>
#include <stdexcept>

namespace shardfit::models {
namespace {

// Keys that would change what is allocated, with the value shardfit
// builds; a config.json that sets another value is refused, naming the key.
struct Unimplemented {
  const char* model_type;
  const char* key;
  nlohmann::json supported;  // the only value accepted (null: the key must be absent or null)
  const char* why;
};

const std::vector<Unimplemented>& unimplemented_keys() {
  static const std::vector<Unimplemented> kKeys = {
      {"gpt2", "add_cross_attention", false, "cross-attention layers are not built"},
      {"gpt2", "reorder_and_upcast_attn", false, "fp32 upcast attention is not built"},
      {"gpt2", "scale_attn_by_inverse_layer_idx", false,
       "per-layer attention scaling is not built"},
      {"gpt2", "gradient_checkpointing", false, "use a +ckpt strategy instead"},
      {"bert", "position_embedding_type", "absolute", "relative position embeddings are not built"},
      {"bert", "is_decoder", false, "BERT as a decoder is not built"},
      {"bert", "add_cross_attention", false, "cross-attention layers are not built"},
      {"bert", "gradient_checkpointing", false, "use a +ckpt strategy instead"},
  };
  return kKeys;
}

}  // namespace

const std::vector<HfArchitecture>& hf_architectures() {
  // transformers' modeling_gpt2 / modeling_bert / modeling_llama,
  // modeling_mistral and modeling_qwen2 classes (models/llama.cc builds all three).
  static const std::vector<HfArchitecture> kArchitectures = {
      {"GPT2LMHeadModel", "gpt2", Head::kCausalLm, "GPT2Block"},
      {"BertForSequenceClassification", "bert", Head::kSequenceClassification, "BertLayer"},
      {"BertForMaskedLM", "bert", Head::kMaskedLm, "BertLayer"},
      {"LlamaForCausalLM", "llama", Head::kCausalLm, "LlamaDecoderLayer"},
      {"MistralForCausalLM", "mistral", Head::kCausalLm, "MistralDecoderLayer"},
      {"Qwen2ForCausalLM", "qwen2", Head::kCausalLm, "Qwen2DecoderLayer"},
  };
  return kArchitectures;
}

// The llama family serves three model_types; gpt2 and bert are their family.
std::string hf_model_type(const ModelConfig& c) {
  return c.model_type.empty() ? std::string(family_name(c.family)) : c.model_type;
}

const HfArchitecture& architecture_of(const ModelConfig& c) {
  const std::string type = hf_model_type(c);
  for (const auto& a : hf_architectures())
    if (c.architecture.empty() ? a.model_type == type : c.architecture == a.name) return a;
  throw std::invalid_argument("no Hugging Face class for " + c.name);
}

std::string hf_block_class(const ModelConfig& config) {
  try {
    return architecture_of(config).block_class;
  } catch (const std::invalid_argument&) {
    return "";
  }
}

bool is_model_dir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

std::string hf_config_path(const std::string& path) {
  return is_model_dir(path) ? (std::filesystem::path(path) / "config.json").string() : path;
}

void apply_hf_architecture(const nlohmann::json& j, ModelConfig& c, const std::string& origin) {
  const std::string type = hf_model_type(c);
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const auto& list = j["architectures"];
    if (!list.is_array() || list.empty() || !list[0].is_string())
      throw std::invalid_argument(origin + ": field 'architectures' must be a list of class names");
    if (list.size() > 1)
      throw std::invalid_argument(origin + ": 'architectures' names " +
                                  std::to_string(list.size()) + " classes; shardfit builds one");
    const std::string name = list[0];
    std::string known;
    const HfArchitecture* found = nullptr;
    for (const auto& a : hf_architectures()) {
      if (a.model_type != type) continue;
      known += (known.empty() ? "" : ", ") + std::string(a.name);
      if (name == a.name) found = &a;
    }
    if (!found)
      throw std::invalid_argument(origin + ": architectures '" + name +
                                  "' is not supported for model_type " + type + " (" + known + ")");
    c.architecture = found->name;
  } else {
    c.architecture = architecture_of(c).name;
  }
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()) {
    if (!j["tie_word_embeddings"].is_boolean())
      throw std::invalid_argument(origin + ": field 'tie_word_embeddings' must be true or false");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  for (const auto& k : unimplemented_keys()) {
    if (k.model_type != type || !j.contains(k.key) || j[k.key].is_null() || j[k.key] == k.supported)
      continue;
    throw std::invalid_argument(origin + ": '" + k.key + "': " + j[k.key].dump() +
                                " is not implemented (" + k.why + "; only " + k.supported.dump() +
                                ")");
  }
  if (type == "bert" && j.contains("id2label") && j["id2label"].is_object() &&
      j.contains("num_labels") && j["num_labels"].is_number_integer() &&
      j["num_labels"].get<int64_t>() != static_cast<int64_t>(j["id2label"].size()))
    throw std::invalid_argument(origin + ": 'num_labels' " + j["num_labels"].dump() +
                                " disagrees with id2label's " +
                                std::to_string(j["id2label"].size()) + " labels");
  if (type == "bert" && j.contains("classifier_dropout") && !j["classifier_dropout"].is_null() &&
      !(j["classifier_dropout"].is_number() &&
        j["classifier_dropout"].get<double>() == c.hidden_dropout))
    throw std::invalid_argument(
        origin + ": 'classifier_dropout' other than hidden_dropout_prob is not implemented");
}

nlohmann::json to_hf_config(const ModelConfig& c) {
  const HfArchitecture& a = architecture_of(c);
  nlohmann::json j = {{"architectures", {a.name}},
                      {"model_type", a.model_type},
                      {"vocab_size", c.vocab_size},
                      {"initializer_range", c.initializer_range}};
  if (c.family == Family::kGpt2) {
    j.update({{"n_embd", c.hidden},
              {"n_layer", c.layers},
              {"n_head", c.heads},
              {"n_positions", c.max_positions},
              {"n_inner", c.intermediate},
              {"resid_pdrop", c.hidden_dropout},
              {"embd_pdrop", c.embd_dropout},
              {"attn_pdrop", c.attn_dropout},
              {"layer_norm_epsilon", c.layer_norm_eps},
              {"activation_function", c.activation},
              {"tie_word_embeddings", c.tie_word_embeddings}});
  } else if (c.family == Family::kLlama) {
    j.update({{"hidden_size", c.hidden},
              {"num_hidden_layers", c.layers},
              {"num_attention_heads", c.heads},
              {"num_key_value_heads", c.kv_heads_or_heads()},
              {"head_dim", c.head_dim_or_default()},
              {"intermediate_size", c.intermediate},
              {"max_position_embeddings", c.max_positions},
              {"rms_norm_eps", c.layer_norm_eps},
              {"rope_theta", c.rope_theta},
              {"attention_dropout", c.attn_dropout},
              {"hidden_act", c.activation},
              {"tie_word_embeddings", c.tie_word_embeddings}});
    if (c.model_type == "llama") j["attention_bias"] = c.qkv_bias;
    if (c.model_type == "mistral") j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    if (c.model_type == "qwen2") j["use_sliding_window"] = c.sliding_window > 0;
    if (c.model_type == "qwen2" && c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
    if (c.rope_factor > 0)
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_factor},
                           {"low_freq_factor", c.rope_low_freq_factor},
                           {"high_freq_factor", c.rope_high_freq_factor},
                           {"original_max_position_embeddings", c.rope_original_max_positions}};
  } else {
    nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
    for (int64_t i = 0; i < c.num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    j.update({{"hidden_size", c.hidden},
              {"num_hidden_layers", c.layers},
              {"num_attention_heads", c.heads},
              {"intermediate_size", c.intermediate},
              {"max_position_embeddings", c.max_positions},
              {"type_vocab_size", c.type_vocab_size},
              {"hidden_dropout_prob", c.hidden_dropout},
              {"attention_probs_dropout_prob", c.attn_dropout},
              {"layer_norm_eps", c.layer_norm_eps},
              {"hidden_act", c.activation},
              {"num_labels", c.num_labels},
              {"id2label", id2label},
              {"label2id", label2id},
              {"position_embedding_type", "absolute"},
              {"tie_word_embeddings", c.tie_word_embeddings}});
  }
  return j;
}

}  // namespace shardfit::models
