// The README's first command builds only the shardfit binary
// (`scripts/build --target shardfit`); scripts/test builds the rest. Checked
// with a stand-in cmake that records its arguments.
#include "tests/cli/cli_harness.h"

#ifndef SHARDFIT_SOURCE_DIR
#error "SHARDFIT_SOURCE_DIR must be the source tree"
#endif

namespace shardfit::cli_test {
namespace {

TEST(BuildScript, TargetBuildsOnlyThatTargetAndTheRestGoesToConfigure) {
  const std::string bin = temp_path("bin"), log = temp_path("cmake.log");
  std::filesystem::create_directories(bin);
  std::ofstream(bin + "/cmake") << "#!/bin/sh\necho \"$@\" >> '" << log << "'\n";
  std::filesystem::permissions(bin + "/cmake", std::filesystem::perms::owner_all);
  const std::string cmd = "PATH='" + bin +
                          "':$PATH SHARDFIT_JOBS=1 bash '" SHARDFIT_SOURCE_DIR
                          "/scripts/build' --target shardfit -DSHARDFIT_WERROR=ON >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string calls = read_file(log);
  std::filesystem::remove_all(bin);
  std::remove(log.c_str());
  const size_t newline = calls.find('\n');
  ASSERT_NE(newline, std::string::npos) << calls;
  const std::string configure = calls.substr(0, newline), build = calls.substr(newline + 1);
  EXPECT_NE(configure.find("-DSHARDFIT_WERROR=ON"), std::string::npos) << configure;
  EXPECT_EQ(configure.find("--target"), std::string::npos) << configure;
  EXPECT_NE(build.find("--build"), std::string::npos) << build;
  EXPECT_NE(build.find("-j1 --target shardfit"), std::string::npos) << build;
  // The README's first command is that one.
  const std::string readme = read_file(SHARDFIT_SOURCE_DIR "/README.md");
  EXPECT_NE(
      readme.find(
          "scripts/install-deps && scripts/build --target shardfit && build/cli/shardfit plan"),
      std::string::npos);
}

}  // namespace
}  // namespace shardfit::cli_test
