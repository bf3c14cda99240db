// llm.c token file header (executor::check_llmc_header): the header as the
// first 1024 bytes, the file's size as the input's.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "executor/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int32_t header[shardfit::executor::kLlmcHeaderInts] = {};
  std::memcpy(header, data, size < sizeof header ? size : sizeof header);
  const int64_t seq_len = size > 0 ? 1 + data[size - 1] : 1;
  try {
    (void)shardfit::executor::check_llmc_header(header, static_cast<int64_t>(size), seq_len,
                                                "fuzz");
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
