#include "models/config_bounds.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace shardfit::models {
namespace {

struct Keys {
  const char *vocab, *positions, *hidden, *layers, *heads, *intermediate, *eps;
};

Keys keys_of(Family f) {
  if (f == Family::kGpt2)
    return {"vocab_size", "n_positions",       "n_embd", "n_layer", "n_head",
            "n_inner",    "layer_norm_epsilon"};
  if (f == Family::kLlama)
    return {"vocab_size",          "max_position_embeddings", "hidden_size",  "num_hidden_layers",
            "num_attention_heads", "intermediate_size",       "rms_norm_eps"};
  return {"vocab_size",          "max_position_embeddings", "hidden_size",   "num_hidden_layers",
          "num_attention_heads", "intermediate_size",       "layer_norm_eps"};
}

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

void check_model_bounds(const ModelConfig& c, const std::string& origin) {
  const Keys k = keys_of(c.family);
  auto at_most = [&](int64_t v, int64_t max, const char* key) {
    if (v > max)
      throw std::invalid_argument(origin + ": field '" + key + "' is " + std::to_string(v) +
                                  ", above the " + std::to_string(max) + " shardfit can plan");
  };
  at_most(c.vocab_size, kMaxVocab, k.vocab);
  at_most(c.max_positions, kMaxPositions, k.positions);
  at_most(c.hidden, kMaxHidden, k.hidden);
  at_most(c.layers, kMaxLayers, k.layers);
  at_most(c.heads, kMaxHeads, k.heads);
  at_most(c.intermediate, kMaxIntermediate, k.intermediate);
  at_most(c.kv_heads, kMaxHeads, "num_key_value_heads");
  at_most(c.head_dim, kMaxHidden, "head_dim");
  if (c.family == Family::kBert) {
    at_most(c.type_vocab_size, kMaxTypeVocab, "type_vocab_size");
    at_most(c.num_labels, kMaxLabels, "num_labels");
    // The data feeds two segments (token types 0 and 1), as BERT's
    // next-sentence pairs do.
    if (c.type_vocab_size < 2)
      throw std::invalid_argument(
          origin + ": field 'type_vocab_size' is " + std::to_string(c.type_vocab_size) +
          "; shardfit's BERT inputs use two segments (token types 0 and 1), so at least 2");
  }
  if (!std::isfinite(c.layer_norm_eps) || c.layer_norm_eps <= 0 || c.layer_norm_eps >= 1)
    throw std::invalid_argument(origin + ": field '" + k.eps + "' is " + num(c.layer_norm_eps) +
                                ", expected a number in (0, 1)");
  if (!std::isfinite(c.initializer_range) || c.initializer_range < 0 || c.initializer_range > 10)
    throw std::invalid_argument(origin + ": field 'initializer_range' is " +
                                num(c.initializer_range) + ", expected a number in [0, 10]");
  // Every field is bounded, so this double estimate cannot overflow.
  const double h = static_cast<double>(c.hidden);
  const double params =
      static_cast<double>(c.layers) * (4 * h * h + 2 * h * static_cast<double>(c.intermediate)) +
      (static_cast<double>(c.vocab_size) + static_cast<double>(c.max_positions)) * h;
  if (params > kMaxParams)
    throw std::invalid_argument(origin + ": about " + num(params) + " parameters (" + k.layers +
                                " " + std::to_string(c.layers) + ", " + k.hidden + " " +
                                std::to_string(c.hidden) + "), above the " + num(kMaxParams) +
                                " shardfit can plan");
}

}  // namespace shardfit::models
