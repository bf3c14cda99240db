// config.json reader (models::parse_hf_config): any bytes are a config or
// std::invalid_argument, never a crash, a hang or another exception.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "models/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto c = shardfit::models::parse_hf_config(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)c.param_count();  // bounded fields: no overflow
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
