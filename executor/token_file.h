// The llm.c token file's header (dev/data/data_common.py: 256 int32, magic
// 20240520, version 1 = uint16 tokens, token count; then the tokens),
// checked without LibTorch so that it is fuzzed (tests/fuzz) and run under
// ASan+UBSan. executor/data.cc reads the tokens through it.
#pragma once

#include <cstdint>
#include <string>

namespace shardfit::executor {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;  // uint16 tokens
constexpr int kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// The number of tokens the file holds, from its header and its size in
// bytes; std::invalid_argument naming `path` when the magic, version or
// count is wrong, or the tokens are fewer than one sequence of `seq_len`.
int64_t check_llmc_header(const int32_t (&header)[kLlmcHeaderInts], int64_t file_bytes,
                          int64_t seq_len, const std::string& path);

}  // namespace shardfit::executor
