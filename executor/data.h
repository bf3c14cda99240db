// Training data: deterministic synthetic batches from a seed, and llm.c's
// uint16 token shards for GPT-2.
//
// Every sequence of a step is addressed by its index in the GLOBAL batch,
// so rank r of N with b sequences each sees exactly the sequences r*b ..
// r*b+b-1 that one rank with a global batch of N*b sees: runs on different
// world sizes train on the same data (what the parity tests rely on).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace shardfit::executor {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The batch of `batch` sequences starting at global sequence index
  // `first_sequence` of step `step` (steps count from 1).
  virtual models::Batch get(int64_t step, int64_t first_sequence, int64_t batch) = 0;
};

// Synthetic data a model can learn, so a falling loss means training works:
// GPT-2: each sequence counts up from a random start with a random stride
//   (token[t+1] = token[t] + stride mod vocab, stride in 1..8), so the next
//   token is predictable from context.
// BERT: sentence pairs [CLS] A [SEP] B [SEP]; label 1 when B repeats A,
//   0 when B is random.
std::unique_ptr<DataSource> make_synthetic(const models::ModelConfig& cfg, int64_t seq_len,
                                           uint64_t seed);

// llm.c token shard: a 256 × int32 header (magic 20240520, version 1,
// token count) followed by uint16 tokens. Sequence i of a step reads the
// seq_len tokens at ((step-1)*global_batch + i) * seq_len, wrapping at the
// end of the file. GPT-2 only. Throws std::invalid_argument naming the file
// on a bad header, a short file or a token outside the vocabulary.
std::unique_ptr<DataSource> make_token_file(const std::string& path,
                                            const models::ModelConfig& cfg, int64_t seq_len,
                                            int64_t global_batch);
// The whole token file checked before any rank starts (`run`'s launcher):
// make_token_file's checks, and every token inside the vocabulary (read in
// 1 MiB pieces: a 100M-token shard in well under a second), so a bad token
// is one line naming the file and the token's index, not an error from each
// rank after init.
void check_token_file(const std::string& path, const models::ModelConfig& cfg, int64_t seq_len);

// The batch on `device`: every tensor copied there (undefined ones stay
// undefined); on the CPU the same tensors, no copy. Sources build batches on
// the host; the engine moves each to its rank's GPU before forward, where
// the copies are what the planner charges for the batch.
models::Batch to_device(models::Batch batch, c10::Device device);

// Writes tokens as an llm.c shard (tests and tools).
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace shardfit::executor
