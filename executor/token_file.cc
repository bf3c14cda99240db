#include "executor/token_file.h"

#include <stdexcept>

namespace shardfit::executor {

int64_t check_llmc_header(const int32_t (&header)[kLlmcHeaderInts], int64_t file_bytes,
                          int64_t seq_len, const std::string& path) {
  if (file_bytes < kLlmcHeaderBytes)
    throw std::invalid_argument(path + ": shorter than the 1024-byte llm.c header");
  if (header[0] != kLlmcMagic)
    throw std::invalid_argument(path + ": bad magic " + std::to_string(header[0]) +
                                " (expected llm.c's 20240520)");
  if (header[1] != kLlmcVersion)
    throw std::invalid_argument(path + ": unsupported version " + std::to_string(header[1]) +
                                " (expected 1: uint16 tokens)");
  const int64_t num_tokens = header[2];
  if (num_tokens < 0)
    throw std::invalid_argument(path + ": header says " + std::to_string(num_tokens) + " tokens");
  const int64_t have = (file_bytes - kLlmcHeaderBytes) / 2;
  if (have < num_tokens)
    throw std::invalid_argument(path + ": header says " + std::to_string(num_tokens) +
                                " tokens but the file holds " + std::to_string(have));
  if (num_tokens < seq_len)
    throw std::invalid_argument(path + ": " + std::to_string(num_tokens) +
                                " tokens, fewer than one sequence of " + std::to_string(seq_len));
  return num_tokens;
}

}  // namespace shardfit::executor
