// Where a test process keeps its files: one folder under the system's
// temporary one, made on first use and removed with everything in it as the
// process exits. ctest runs every test in a process of its own, so a passing
// run leaves nothing behind; a process with a failed test keeps its folder
// to look at and says where. Header-only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

namespace shardfit::test_support {

class ScratchRoot {
 public:
  ScratchRoot()
      : owner_(::getpid()),
        path_(std::filesystem::temp_directory_path() / ("shardfit-tests-" + std::to_string(owner_))) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchRoot() {
    if (::getpid() != owner_) return;  // a forked child leaving through exit(): the files are its parent's
    if (::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      std::cerr << "the failed test's files are kept in " << path_.string() << "\n";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  pid_t owner_;
  std::filesystem::path path_;
};

// This process's folder (ScratchRoot above).
inline const std::filesystem::path& scratch_root() {
  static const ScratchRoot root;
  return root.path();
}

}  // namespace shardfit::test_support
