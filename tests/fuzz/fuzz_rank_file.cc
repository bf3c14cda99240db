// Checkpoint rank file reader: the header and tensor table, the unit
// layouts, then every tensor's data against its checksum.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "executor/checkpoint_format.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const shardfit::fuzz::MemFile f(data, size);
  try {
    const auto rf = shardfit::executor::ckpt::read_rank_header(f.path(), -1, 0);
    (void)shardfit::executor::ckpt::verify_rank_data(rf);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
