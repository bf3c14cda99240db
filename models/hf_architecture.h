// Hugging Face's model classes, as shardfit builds them. A config.json's
// `architectures` decides the head; one the table lacks is refused (exit 2),
// and so is any key that changes memory but is not implemented, never
// ignored. No LibTorch here.
//
// To add a family: one row per class in hf_architectures() (hf_architecture.cc)
// with its model_type, head and block class, and its keys in the model_type's
// parser (model_config.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/model_config.h"

namespace shardfit::models {

enum class Head {
  kCausalLm,                // next-token loss over the vocabulary (GPT2LMHeadModel)
  kSequenceClassification,  // pooled [CLS] -> num_labels (BertForSequenceClassification)
  kMaskedLm,                // vocabulary-wide logits per token, tied decoder (BertForMaskedLM)
};

struct HfArchitecture {
  const char* name;        // "GPT2LMHeadModel"
  const char* model_type;  // config.json's model_type: "gpt2"
  Head head;
  const char* block_class;  // the transformer block: "GPT2Block"
};

// Every class shardfit builds.
const std::vector<HfArchitecture>& hf_architectures();

// The row for `config` (its architecture, or its family's default).
// Throws std::invalid_argument when there is none.
const HfArchitecture& architecture_of(const ModelConfig& config);
// The config's Hugging Face model_type: the llama family serves llama,
// mistral and qwen2; gpt2 and bert are their family's name.
std::string hf_model_type(const ModelConfig& config);

// "GPT2Block", "BertLayer"; "" for a config without a known class.
std::string hf_block_class(const ModelConfig& config);

// `dir/config.json` when `path` is a directory, else `path`.
std::string hf_config_path(const std::string& path);
bool is_model_dir(const std::string& path);

// Applies config.json's `architectures` and `tie_word_embeddings` to `c`
// (whose model_type fields are parsed), and refuses, naming the key, what
// shardfit does not build: an unknown or mismatched architecture, and keys
// that would change memory (cross-attention, relative positions, upcast
// attention, ...). Throws std::invalid_argument with one line.
void apply_hf_architecture(const nlohmann::json& config_json, ModelConfig& c,
                           const std::string& origin);

// A config.json transformers reads back as the same model (`--export`
// writes it beside the safetensors file).
nlohmann::json to_hf_config(const ModelConfig& c);

}  // namespace shardfit::models
