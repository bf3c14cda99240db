// Model configurations: the built-in registry (`shardfit models`) and the
// Hugging Face `config.json` reader. No LibTorch here: the planner core and
// the CLI's input checks use it without building a model.
//
// Names follow Hugging Face so a user can read a config.json next to ours:
// GPT-2 (`n_embd`, `n_layer`, ...) and BERT (`hidden_size`, ...) are mapped to
// one struct whose fields say what they are.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardfit::models {

enum class Family { kGpt2, kBert, kLlama };

// The largest head dimension cuDNN's attention is modelled for, as in
// pytorch/cuda_attention.py: its workspaces follow cudnn-frontend's
// composite backward node and one card recording at head dimension 64,
// while 2.11 runs cuDNN's kernel up to 256 at compute capability 9.0.
constexpr int64_t kCudnnAttentionMaxHeadDim = 128;

struct ModelConfig {
  std::string name;  // "gpt2-large", or the config.json path it came from
  Family family = Family::kGpt2;
  int64_t vocab_size = 0;
  int64_t max_positions = 0;   // gpt2: n_positions; bert: max_position_embeddings
  int64_t hidden = 0;          // gpt2: n_embd; bert: hidden_size
  int64_t layers = 0;          // gpt2: n_layer; bert: num_hidden_layers
  int64_t heads = 0;           // gpt2: n_head; bert: num_attention_heads
  int64_t intermediate = 0;    // gpt2: n_inner (default 4*n_embd); bert: intermediate_size
  int64_t type_vocab_size = 0; // bert only (segment embeddings)
  int64_t num_labels = 0;      // bert only (sequence classification head)
  double layer_norm_eps = 1e-5;
  double initializer_range = 0.02;
  // Dropout probabilities. gpt2: resid_pdrop, embd_pdrop, attn_pdrop;
  // bert: hidden_dropout_prob (used for both hidden and embeddings),
  // attention_probs_dropout_prob.
  double hidden_dropout = 0.1;
  double embd_dropout = 0.1;
  double attn_dropout = 0.1;
  std::string activation;      // "gelu_new" (gpt2, tanh approximation) or "gelu" (bert, erf)
  // Hugging Face's class (config.json "architectures"[0], see
  // hf_architecture.h): decides the head. "" means the family's default.
  std::string architecture;
  // gpt2: lm_head shares transformer.wte.weight (Hugging Face's default);
  // false gives lm_head a weight of its own (vocab x hidden more params).
  // bert MLM: the decoder is the word embeddings. llama: lm_head is
  // model.embed_tokens' weight.
  bool tie_word_embeddings = true;
  // bert: BertForMaskedLM (vocabulary-wide MLM head, no pooler, labels per
  // token) rather than sequence classification.
  bool masked_lm() const { return architecture == "BertForMaskedLM"; }

  // Llama family (Hugging Face model_type llama, mistral, qwen2); see
  // models/llama_config.cc. layer_norm_eps holds rms_norm_eps, heads
  // num_attention_heads, intermediate intermediate_size.
  std::string model_type;          // "llama", "mistral" or "qwen2" (empty for gpt2/bert)
  int64_t kv_heads = 0;            // num_key_value_heads (GQA); 0: equal to heads
  int64_t head_dim = 0;            // head_dim; 0: hidden / heads
  bool qkv_bias = false;           // q/k/v projections carry biases (qwen2, llama attention_bias)
  bool o_bias = false;             // o_proj carries a bias (llama attention_bias)
  // (tie_word_embeddings above: the llama reader defaults it to false, as
  // transformers' LlamaConfig does.)
  double rope_theta = 10000.0;
  // rope_scaling of type llama3 (factor 0: none): Llama 3.1's frequency
  // rescaling by wavelength.
  double rope_factor = 0.0, rope_low_freq_factor = 0.0, rope_high_freq_factor = 0.0;
  int64_t rope_original_max_positions = 0;
  int64_t sliding_window = 0;      // mistral/qwen2 window; 0: none. Sequences longer are refused.
  // `--loss chunked:N` (llama family): cross-entropy N tokens at a time
  // (models/chunked_loss.h); 0: `--loss full`, the whole logits matrix.
  int64_t loss_chunk = 0;
  // `--attention flash` (gpt2 and the llama family, CUDA only): PyTorch's
  // FlashAttention-2 kernel through scaled_dot_product_attention instead of
  // the eager softmax(QK^T)V (models/attention.h). The planner sets
  // flash_sm_count from the device profile: the forward kernel's split-KV
  // heuristic reads the number of SMs.
  bool flash_attention = false;
  int64_t flash_sm_count = 0;
  // PyTorch's memory-efficient kernel (CUTLASS) through
  // scaled_dot_product_attention: what `--attention sdpa` runs on CUDA in
  // fp32 or below compute capability 8.0 (models/attention.h).
  bool efficient_attention = false;
  // cuDNN's fused attention through scaled_dot_product_attention: what
  // `--attention sdpa` runs on Hopper (compute capability 9.0) in fp16 and
  // bf16 under PyTorch 2.11, which puts cuDNN first there (models/attention.h).
  bool cudnn_attention = false;
  // `--attention sdpa` (the default) before it is resolved for a device and
  // a precision (resolve_sdpa): then one of the kernels above, or eager.
  bool sdpa_attention = false;

  int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_dim_or_default() const { return head_dim > 0 ? head_dim : hidden / heads; }

  // Exact parameter count, from shapes alone (tied GPT-2 output embedding
  // counted once). Equal to the sum of numel over the built module's
  // parameters; tests check both agree.
  int64_t param_count() const;
};

// Built-in names: gpt2, gpt2-medium, gpt2-large, gpt2-xl, bert-base,
// bert-large, gpt2-tiny, bert-tiny, then the llama family's (llama_builtins).
const std::vector<ModelConfig>& builtin_models();
// The built-in named `name`, or nullptr.
const ModelConfig* find_builtin(const std::string& name);

// A config.json whose model_type has no built-in C++ model (gemma2, phi3,
// mixtral, ...): what plan needs to trace it through transformers' own class
// instead (launch/hf_trace_route.h). Its message names that route.
struct NoBuiltinModel : std::invalid_argument {
  NoBuiltinModel(const std::string& what, std::string path, std::string type)
      : std::invalid_argument(what), config_path(std::move(path)), model_type(std::move(type)) {}
  std::string config_path;  // the config.json read (a Hub id's: its cached snapshot's)
  std::string model_type;
};

// The config.json a model names that is not a built-in: a path to it, a
// model directory holding one, or a Hub id's in the local Hugging Face
// cache. Throws std::invalid_argument with one line naming the input (an
// unknown name, a Hub id not in the cache); the file is not read.
std::string hf_config_file(const std::string& name_or_path);

// A built-in name or a path to a Hugging Face config.json (model_type gpt2
// or bert). Throws std::invalid_argument with one line naming the input and
// what is wrong (unknown name, unreadable file, malformed JSON, missing or
// bad field, unsupported model_type).
ModelConfig resolve_model(const std::string& name_or_path);

// Reads a config.json text; `origin` names it in errors.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& origin);

const char* family_name(Family f);

// The llama family (models/llama_config.cc): built-ins (Llama 3.x, Qwen2.5,
// Mistral 7B and the test sizes llama-tiny, qwen-tiny), the config.json
// reader for model_type llama/mistral/qwen2 and the exact parameter count.
std::vector<ModelConfig> llama_builtins();
ModelConfig parse_llama_config(const std::string& json_text, const std::string& origin);
int64_t llama_param_count(const ModelConfig& c);
// The one check of a sequence length, for plan, trace and run alike: 2 up
// to the model's positions; BERT's sentence pairs need 5; a llama-family
// sliding window must not be shorter (not implemented: refused naming the
// config key). Throws std::invalid_argument starting "--seq-len N".
void check_seq_len(const ModelConfig& c, int64_t seq_len);

// `--loss`: "full" or "chunked:N" (N tokens at a time, N >= 1) into
// c->loss_chunk. Throws std::invalid_argument naming --loss (a bad value, or
// chunking for a family without it: only the llama family chunks).
void set_loss(ModelConfig* c, const std::string& loss);
std::string loss_name(const ModelConfig& c);  // "full" or "chunked:N"

// `--attention`: "sdpa", "eager" or "flash" into c. Throws
// std::invalid_argument naming --attention (a bad value; flash for BERT,
// whose padding mask PyTorch's flash kernel does not take; a head dimension
// the kernel refuses: not a multiple of 8 or above 256).
void set_attention(ModelConfig* c, const std::string& attention);
// "sdpa" (not yet resolved), "eager", "flash", "efficient" or "cudnn".
const char* attention_name(const ModelConfig& c);
// Whether `c` computes attention with a fused kernel (flash, memory-efficient
// or cuDNN's: models/attention.h) rather than eager softmax(QK^T)V.
bool fused_attention(const ModelConfig& c);
// `--attention sdpa` as PyTorch 2.11's scaled_dot_product_attention picks
// a kernel for transformers' sdpa attention (causal, no mask) on a device:
// on CUDA computing in fp16 or bf16 (`half`), cuDNN's at compute capability
// 9.0 and 10.0 and flash from 8.0; elsewhere on CUDA the memory-efficient
// one; on a CPU eager, what shardfit's CPU engine runs. BERT (its padding
// mask) and a head dimension the flash kernel refuses keep eager. Throws
// std::invalid_argument naming --attention where 2.11 would run cuDNN's
// kernel at a head dimension it is not modelled for (above 128). A config
// that is not sdpa comes back unchanged.
ModelConfig resolve_sdpa(const ModelConfig& c, bool cuda, double compute_capability, bool half);

}  // namespace shardfit::models
