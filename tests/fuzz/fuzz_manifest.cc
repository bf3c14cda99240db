// Checkpoint manifest reader (a directory holding manifest.json), and
// `shardfit verify` on that directory.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "executor/checkpoint_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                           ("shardfit-fuzz-manifest-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "manifest.json", std::ios::binary)
      .write(reinterpret_cast<const char*>(data), size);
  try {
    (void)shardfit::executor::ckpt::read_manifest(dir);
    (void)shardfit::executor::ckpt::verify_path(dir);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
