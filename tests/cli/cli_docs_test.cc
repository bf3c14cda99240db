// docs/cli.md is the CLI's own help (shardfit --help-markdown): an option
// added, renamed or re-described without the page written again fails here.
#include <gtest/gtest.h>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

TEST(CliDocs, TheCommandsPageIsWhatTheCliSays) {
  const Result r = shardfit({"--help-markdown"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string page = read_file(SHARDFIT_SOURCE_DIR "/docs/cli.md");
  EXPECT_TRUE(page == r.out) << "docs/cli.md differs from the CLI's help: run scripts/cli-docs";
  // Every subcommand has its section, and the page names every option the
  // help of one of them prints.
  for (const char* command : {"models", "plan", "run", "validate", "compare", "report", "export-config", "verify",
                              "calibrate"})
    EXPECT_NE(r.out.find(std::string("## `shardfit ") + command + "`"), std::string::npos) << command;
  const Result help = shardfit({"plan", "--help"});
  for (const char* option : {"--torch", "--prefetch", "--gpu-mem", "--strategies"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option;
    EXPECT_NE(r.out.find(std::string("`") + option + "`"), std::string::npos) << option;
  }
}

}  // namespace
}  // namespace shardfit::cli_test
