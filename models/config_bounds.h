// Bounds on a model configuration, checked before anything is allocated or
// traced: a config.json that no planner trace or machine could
// hold (n_layer 1e9, vocab_size 2^63-1, n_embd 1e9) is one line naming the
// key, at once, instead of minutes of allocation and a bad_alloc. Also the
// floating fields a model cannot train with (a negative layer_norm_epsilon
// or initializer_range). No LibTorch.
#pragma once

#include <string>

#include "models/model_config.h"

namespace shardfit::models {

// The largest sizes accepted (far above any published model, far below
// what overflows an int64 byte count).
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHidden = 1 << 17;        // 131072
constexpr int64_t kMaxIntermediate = 1 << 20;  // 1048576
constexpr int64_t kMaxVocab = 1 << 24;         // 16.7 M tokens
constexpr int64_t kMaxPositions = 1 << 20;
constexpr int64_t kMaxHeads = 1 << 12;
constexpr int64_t kMaxTypeVocab = 1 << 10;
constexpr int64_t kMaxLabels = 1 << 20;
constexpr double kMaxParams = 1e13;  // 10 T parameters

// Throws std::invalid_argument "<origin>: field '<key>' is N, ..." (the
// config.json key of the family) for the first field out of bounds.
void check_model_bounds(const ModelConfig& c, const std::string& origin);

}  // namespace shardfit::models
