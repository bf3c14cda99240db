#include "executor/data.h"

#include "executor/token_file.h"

#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace shardfit::executor {
namespace {


uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

torch::Tensor to_tensor(std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  return torch::from_blob(v.data(), {rows, cols}, torch::kLong).clone();
}

class SyntheticData final : public DataSource {
 public:
  SyntheticData(const models::ModelConfig& cfg, int64_t seq_len, uint64_t seed)
      : cfg_(cfg), seq_len_(seq_len), seed_(seed) {}

  models::Batch get(int64_t step, int64_t first, int64_t batch) override {
    std::vector<int64_t> ids(batch * seq_len_), types(batch * seq_len_, 0);
    std::vector<int64_t> labels(batch, 0);
    std::vector<int64_t> mlm_labels(cfg_.masked_lm() ? batch * seq_len_ : 0, -100);
    const int64_t v = cfg_.vocab_size;
    for (int64_t i = 0; i < batch; ++i) {
      std::mt19937_64 rng(mix(seed_ ^ mix(step * 1000003ULL + (first + i))));
      int64_t* row = ids.data() + i * seq_len_;
      if (cfg_.family != models::Family::kBert) {  // causal LM
        int64_t tok = static_cast<int64_t>(rng() % v);
        const int64_t stride = 1 + static_cast<int64_t>(rng() % 8);
        for (int64_t t = 0; t < seq_len_; ++t, tok = (tok + stride) % v) row[t] = tok;
      } else {
        // [CLS] A [SEP] B [SEP] with |A| = |B| = (seq_len - 3) / 2, rest padding-free.
        const int64_t cls = v > 102 ? 101 : 1, sep = v > 102 ? 102 : 2;
        const int64_t half = (seq_len_ - 3) / 2;
        const bool same = rng() % 2 == 0;
        auto word = [&] { return 3 + static_cast<int64_t>(rng() % (v - 3)); };
        row[0] = cls;
        for (int64_t t = 0; t < half; ++t) row[1 + t] = word();
        row[1 + half] = sep;
        for (int64_t t = 0; t < seq_len_ - 3 - half; ++t)
          row[2 + half + t] = same && t < half ? row[1 + t] : word();
        row[seq_len_ - 1] = sep;
        for (int64_t t = 2 + half; t < seq_len_; ++t) types[i * seq_len_ + t] = 1;
        labels[i] = same ? 1 : 0;
        if (cfg_.masked_lm()) {
          // MLM: 15% of the word positions become [MASK] (103, BERT's id)
          // and are the labels; -100 elsewhere. At least one per sequence. In
          // a repeating pair, a masked word of B is A's, so it is learnable.
          int64_t* lab = mlm_labels.data() + i * seq_len_;
          const int64_t mask = v > 103 ? 103 : 0;
          bool any = false;
          for (int64_t t = 1; t < seq_len_ - 1; ++t) {
            if (row[t] == sep || (rng() % 100 >= 15 && !(t == seq_len_ - 2 && !any))) continue;
            lab[t] = row[t];
            row[t] = mask;
            any = true;
          }
        }
      }
    }
    models::Batch b;
    b.input_ids = to_tensor(ids, batch, seq_len_);
    if (cfg_.family == models::Family::kBert) {
      b.token_type_ids = to_tensor(types, batch, seq_len_);
      b.attention_mask = torch::ones({batch, seq_len_}, torch::kLong);
      b.labels = cfg_.masked_lm() ? to_tensor(mlm_labels, batch, seq_len_)
                                  : torch::from_blob(labels.data(), {batch}, torch::kLong).clone();
    }
    return b;
  }

 private:
  models::ModelConfig cfg_;
  int64_t seq_len_;
  uint64_t seed_;
};

class TokenFileData final : public DataSource {
 public:
  TokenFileData(const std::string& path, const models::ModelConfig& cfg, int64_t seq_len,
                int64_t global_batch)
      : path_(path), seq_len_(seq_len), global_batch_(global_batch), in_(path, std::ios::binary) {
    if (cfg.family == models::Family::kBert)
      throw std::invalid_argument(path + ": token files train causal LMs only (not BERT)");
    if (!in_) throw std::invalid_argument(path + ": cannot read token file");
    int32_t header[kLlmcHeaderInts] = {};
    in_.read(reinterpret_cast<char*>(header), sizeof(header));
    in_.clear();
    in_.seekg(0, std::ios::end);
    num_tokens_ = check_llmc_header(header, static_cast<int64_t>(in_.tellg()), seq_len_, path);
    vocab_ = cfg.vocab_size;
  }

  models::Batch get(int64_t step, int64_t first, int64_t batch) override {
    std::vector<int64_t> ids(batch * seq_len_);
    std::vector<uint16_t> buf(seq_len_);
    const int64_t windows = num_tokens_ / seq_len_;
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t window = ((step - 1) * global_batch_ + first + i) % windows;
      in_.clear();
      in_.seekg(kLlmcHeaderInts * 4 + window * seq_len_ * 2);
      in_.read(reinterpret_cast<char*>(buf.data()), seq_len_ * 2);
      for (int64_t t = 0; t < seq_len_; ++t) {
        if (buf[t] >= vocab_)
          throw std::invalid_argument(path_ + ": token " + std::to_string(buf[t]) +
                                      " is outside the model's vocabulary of " +
                                      std::to_string(vocab_));
        ids[i * seq_len_ + t] = buf[t];
      }
    }
    models::Batch b;
    b.input_ids = to_tensor(ids, batch, seq_len_);
    return b;
  }

 private:
  std::string path_;
  int64_t seq_len_, global_batch_, num_tokens_ = 0, vocab_ = 0;
  std::ifstream in_;
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic(const models::ModelConfig& cfg, int64_t seq_len,
                                           uint64_t seed) {
  return std::make_unique<SyntheticData>(cfg, seq_len, seed);
}

void check_token_file(const std::string& path, const models::ModelConfig& cfg, int64_t seq_len) {
  TokenFileData header_checks(path, cfg, seq_len, 1);  // family, readable, header, length
  std::ifstream in(path, std::ios::binary);
  in.seekg(kLlmcHeaderBytes);
  std::vector<uint16_t> buf(1 << 19);
  int64_t index = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 2));
    const int64_t n = in.gcount() / 2;
    for (int64_t t = 0; t < n; ++t, ++index)
      if (buf[t] >= cfg.vocab_size)
        throw std::invalid_argument(path + ": token " + std::to_string(buf[t]) + " at index " +
                                    std::to_string(index) + " is outside the model's vocabulary of " +
                                    std::to_string(cfg.vocab_size));
  }
}

std::unique_ptr<DataSource> make_token_file(const std::string& path,
                                            const models::ModelConfig& cfg, int64_t seq_len,
                                            int64_t global_batch) {
  return std::make_unique<TokenFileData>(path, cfg, seq_len, global_batch);
}

models::Batch to_device(models::Batch batch, c10::Device device) {
  if (device.is_cpu()) return batch;
  for (torch::Tensor* t : {&batch.input_ids, &batch.token_type_ids, &batch.attention_mask, &batch.labels})
    if (t->defined()) *t = t->to(device);
  return batch;
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
}

}  // namespace shardfit::executor
