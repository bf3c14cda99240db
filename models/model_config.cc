#include "models/model_config.h"

#include "models/hf_architecture.h"
#include "models/hf_hub_cache.h"
#include "models/config_bounds.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace shardfit::models {
namespace {

ModelConfig gpt2(const std::string& name, int64_t hidden, int64_t layers, int64_t heads,
                 int64_t vocab = 50257, int64_t positions = 1024) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kGpt2;
  c.vocab_size = vocab;
  c.max_positions = positions;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.intermediate = 4 * hidden;
  c.layer_norm_eps = 1e-5;
  c.activation = "gelu_new";
  return c;
}

ModelConfig bert(const std::string& name, int64_t hidden, int64_t layers, int64_t heads,
                 int64_t intermediate, int64_t vocab = 30522, int64_t positions = 512) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kBert;
  c.vocab_size = vocab;
  c.max_positions = positions;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.intermediate = intermediate;
  c.type_vocab_size = 2;
  c.num_labels = 2;  // GLUE MRPC: paraphrase or not
  c.layer_norm_eps = 1e-12;
  c.activation = "gelu";
  return c;
}

void check_positive(const ModelConfig& c, const std::string& origin) {
  auto need = [&](int64_t v, const char* field) {
    if (v <= 0)
      throw std::invalid_argument(origin + ": field '" + field + "' must be a positive integer");
  };
  need(c.vocab_size, "vocab_size");
  need(c.max_positions, c.family == Family::kGpt2 ? "n_positions" : "max_position_embeddings");
  need(c.hidden, c.family == Family::kGpt2 ? "n_embd" : "hidden_size");
  need(c.layers, c.family == Family::kGpt2 ? "n_layer" : "num_hidden_layers");
  need(c.heads, c.family == Family::kGpt2 ? "n_head" : "num_attention_heads");
  need(c.intermediate, c.family == Family::kGpt2 ? "n_inner" : "intermediate_size");
  if (c.hidden % c.heads != 0)
    throw std::invalid_argument(origin + ": hidden size " + std::to_string(c.hidden) +
                                " is not divisible by " + std::to_string(c.heads) + " heads");
  if (c.family == Family::kBert) {
    need(c.type_vocab_size, "type_vocab_size");
    need(c.num_labels, "num_labels");
  }
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::kGpt2:
      return "gpt2";
    case Family::kBert:
      return "bert";
    case Family::kLlama:
      return "llama";
  }
  return "gpt2";
}

int64_t ModelConfig::param_count() const {
  const int64_t h = hidden, i = intermediate;
  if (family == Family::kLlama) return llama_param_count(*this);
  const int64_t ln = 2 * h;  // LayerNorm weight + bias
  if (family == Family::kGpt2) {
    const int64_t block = ln + (h * 3 * h + 3 * h) + (h * h + h) + ln + (h * i + i) + (i * h + h);
    const int64_t lm_head = tie_word_embeddings ? 0 : vocab_size * h;  // tied: wte's weight
    return vocab_size * h + max_positions * h + layers * block + ln + lm_head;
  }
  const int64_t embeddings = vocab_size * h + max_positions * h + type_vocab_size * h + ln;
  const int64_t layer = 4 * (h * h + h) + ln + (h * i + i) + (i * h + h) + ln;
  if (masked_lm()) {  // cls.predictions: transform dense + LayerNorm, decoder bias (+ weight untied)
    const int64_t head = h * h + h + ln + vocab_size + (tie_word_embeddings ? 0 : vocab_size * h);
    return embeddings + layers * layer + head;
  }
  const int64_t pooler = h * h + h;
  const int64_t classifier = h * num_labels + num_labels;
  return embeddings + layers * layer + pooler + classifier;
}

const std::vector<ModelConfig>& builtin_models() {
  static const std::vector<ModelConfig> kModels = [] {
    std::vector<ModelConfig> m;
    // Hugging Face hub configs of openai-community/gpt2{,-medium,-large,-xl}.
    m.push_back(gpt2("gpt2", 768, 12, 12));
    m.push_back(gpt2("gpt2-medium", 1024, 24, 16));
    m.push_back(gpt2("gpt2-large", 1280, 36, 20));
    m.push_back(gpt2("gpt2-xl", 1600, 48, 25));
    // google-bert/bert-{base,large}-uncased.
    m.push_back(bert("bert-base", 768, 12, 12, 3072));
    m.push_back(bert("bert-large", 1024, 24, 16, 4096));
    // Test size: the same code, small enough to train in seconds on a CPU.
    ModelConfig gt = gpt2("gpt2-tiny", 64, 2, 4, /*vocab=*/512, /*positions=*/128);
    m.push_back(gt);
    ModelConfig bt = bert("bert-tiny", 64, 2, 4, 256, /*vocab=*/512, /*positions=*/128);
    m.push_back(bt);
    for (auto& l : llama_builtins()) m.push_back(std::move(l));
    return m;
  }();
  return kModels;
}

ModelConfig parse_hf_config(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(origin + ": malformed JSON at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::exception& e) {  // 1e99999: number overflow (found by fuzz_config)
    throw std::invalid_argument(origin + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(origin + ": expected a JSON object");
  if (!j.contains("model_type") || !j["model_type"].is_string())
    throw std::invalid_argument(origin + ": missing string field 'model_type' (gpt2 or bert)");
  const std::string type = j["model_type"];
  if (type == "llama" || type == "mistral" || type == "qwen2") return parse_llama_config(text, origin);

  auto get_int = [&](const char* field, int64_t fallback, bool required) -> int64_t {
    if (!j.contains(field) || j[field].is_null()) {
      if (required) throw std::invalid_argument(origin + ": missing field '" + field + "'");
      return fallback;
    }
    if (!j[field].is_number_integer())
      throw std::invalid_argument(origin + ": field '" + field + "' must be an integer");
    return j[field].get<int64_t>();
  };
  auto get_double = [&](const char* field, double fallback) -> double {
    if (!j.contains(field) || j[field].is_null()) return fallback;
    if (!j[field].is_number())
      throw std::invalid_argument(origin + ": field '" + field + "' must be a number");
    return j[field].get<double>();
  };
  auto get_string = [&](const char* field, const std::string& fallback) -> std::string {
    if (!j.contains(field) || j[field].is_null()) return fallback;
    if (!j[field].is_string())
      throw std::invalid_argument(origin + ": field '" + field + "' must be a string");
    return j[field].get<std::string>();
  };

  ModelConfig c;
  c.name = origin;
  if (type == "gpt2") {
    // Defaults are transformers' GPT2Config defaults.
    c = gpt2(origin, get_int("n_embd", 768, false), get_int("n_layer", 12, false),
             get_int("n_head", 12, false), get_int("vocab_size", 50257, false),
             get_int("n_positions", get_int("n_ctx", 1024, false), false));
    c.intermediate = get_int("n_inner", 4 * c.hidden, false);
    c.hidden_dropout = get_double("resid_pdrop", 0.1);
    c.embd_dropout = get_double("embd_pdrop", 0.1);
    c.attn_dropout = get_double("attn_pdrop", 0.1);
    c.layer_norm_eps = get_double("layer_norm_epsilon", 1e-5);
    c.activation = get_string("activation_function", "gelu_new");
    if (c.activation != "gelu_new" && c.activation != "gelu_pytorch_tanh" && c.activation != "gelu")
      throw std::invalid_argument(origin + ": activation_function '" + c.activation +
                                  "' is not supported (gelu_new, gelu_pytorch_tanh, gelu)");
    if (c.activation == "gelu_pytorch_tanh") c.activation = "gelu_new";  // same function
  } else if (type == "bert") {
    c = bert(origin, get_int("hidden_size", 768, false), get_int("num_hidden_layers", 12, false),
             get_int("num_attention_heads", 12, false), get_int("intermediate_size", 3072, false),
             get_int("vocab_size", 30522, false), get_int("max_position_embeddings", 512, false));
    c.type_vocab_size = get_int("type_vocab_size", 2, false);
    int64_t labels = 2;
    if (j.contains("id2label") && j["id2label"].is_object()) labels = j["id2label"].size();
    c.num_labels = get_int("num_labels", labels, false);
    c.hidden_dropout = c.embd_dropout = get_double("hidden_dropout_prob", 0.1);
    c.attn_dropout = get_double("attention_probs_dropout_prob", 0.1);
    c.layer_norm_eps = get_double("layer_norm_eps", 1e-12);
    c.activation = get_string("hidden_act", "gelu");
    if (c.activation != "gelu" && c.activation != "gelu_new")
      throw std::invalid_argument(origin + ": hidden_act '" + c.activation +
                                  "' is not supported (gelu, gelu_new)");
  } else {
    throw NoBuiltinModel(origin + ": model_type '" + type + "' has no built-in (gpt2, bert, llama, mistral, " +
                             "qwen2); trace transformers' own class: .venv/bin/python " +
                             "pytorch/trace_recorder.py --model hf: --config " + origin +
                             " --seq-len N --out model.trace.json, then plan --trace model.trace.json",
                         origin, type);
  }
  c.initializer_range = get_double("initializer_range", 0.02);
  for (double p : {c.hidden_dropout, c.embd_dropout, c.attn_dropout})
    if (p < 0 || p >= 1)
      throw std::invalid_argument(origin + ": dropout probabilities must be in [0, 1)");
  check_positive(c, origin);
  check_model_bounds(c, origin);            // before anything is sized from it
  apply_hf_architecture(j, c, origin);  // architectures, tie_word_embeddings, unimplemented keys
  return c;
}

std::string hf_config_file(const std::string& name_or_path) {
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               is_model_dir(name_or_path) ||
                               (name_or_path.size() > 5 &&
                                    name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (!looks_like_path) {
    std::string names;
    for (const auto& m : builtin_models()) names += (names.empty() ? "" : ", ") + m.name;
    throw std::invalid_argument("unknown model '" + name_or_path + "' (built-in: " + names +
                                "; or a path to a Hugging Face config.json)");
  }
  // A Hugging Face model directory: its config.json; a Hub id not on disk:
  // its config.json in the local Hugging Face cache.
  std::string path = hf_config_path(name_or_path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && looks_like_hub_id(name_or_path)) {
    const auto cached = find_cached_hub_config(name_or_path);
    if (!cached)
      throw std::invalid_argument(name_or_path + ": no such file, nor a Hub id in the local Hugging Face cache (" +
                                  hf_hub_cache_dir() + "/models--" +
                                  name_or_path.substr(0, name_or_path.find('/')) + "--" +
                                  name_or_path.substr(name_or_path.find('/') + 1) +
                                  "/snapshots/*/config.json); fetch it (huggingface-cli download " + name_or_path +
                                  " config.json) or give a config.json's path");
    path = *cached;
  }
  return path;
}

const ModelConfig* find_builtin(const std::string& name) {
  for (const auto& m : builtin_models())
    if (m.name == name) return &m;
  return nullptr;
}

ModelConfig resolve_model(const std::string& name_or_path) {
  if (const ModelConfig* m = find_builtin(name_or_path)) return *m;
  const std::string path = hf_config_file(name_or_path);
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot read file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path);
}

}  // namespace shardfit::models
