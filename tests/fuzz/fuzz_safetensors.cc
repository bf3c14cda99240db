// safetensors reader (header, __metadata__ checksums) and verification of
// every tensor's data.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "executor/checkpoint_format.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const shardfit::fuzz::MemFile f(data, size);
  try {
    const shardfit::executor::ckpt::ReadFile file(f.path());
    const auto h = shardfit::executor::ckpt::read_safetensors_header(file);
    for (const auto& e : h.tensors)
      if (!e.checksum.empty())
        shardfit::executor::ckpt::verify_tensor_data(file, h.data_start, e, e.checksum);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
