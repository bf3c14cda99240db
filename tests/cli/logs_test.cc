// Results on stdout, logs on stderr; --log-level, --quiet, --version; the
// progress lines of long commands; `plan --top N`.
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

TEST(Logs, VersionNamesShardfitAndLibTorch) {
  const Result r = shardfit({"--version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("shardfit ", 0), 0u) << r.out;
  // The LibTorch the build found (CMake's Torch_VERSION).
  EXPECT_NE(r.out.find(std::string("LibTorch ") + SHARDFIT_LIBTORCH_VERSION + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CUDA: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NCCL: "), std::string::npos) << r.out;
}

TEST(Logs, GoToStderrAndQuietSilencesThem) {
  const std::vector<std::string> run = {"run", "--model", "gpt2-tiny", "--seq-len",
                                        "16",  "--steps", "2"};
  Result r = shardfit(run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step 1/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;  // step 1 of 2
  EXPECT_EQ(r.out.find("step 1/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: peak allocated"), std::string::npos) << r.out;  // the result
  std::vector<std::string> quiet = run;
  quiet.push_back("--quiet");
  r = shardfit(quiet);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("rank 0: peak allocated"), std::string::npos);
  r = shardfit(
      {"--log-level", "warn", "run", "--model", "gpt2-tiny", "--seq-len", "16", "--steps", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("step 1/1"), std::string::npos) << r.err;
  expect_bad_input({"models", "--log-level", "chatty"}, "--log-level chatty");
}

TEST(Progress, ValidateSaysWhereItIsWithAnEta) {
  const std::string plan = temp_path("plan.json");
  Result r =
      shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "32", "--gpus", "1", "--device", "cpu",
                "--gpu-mem", "6MiB", "--strategies", "ddp/fp32/wrap=none", "--out", plan});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string dir = temp_path("validate");
  r = shardfit({"validate", "--plan", plan, "--out-dir", dir});
  std::filesystem::remove_all(dir);
  std::remove(plan.c_str());
  // max fits, max+1 goes out of memory (run --oom-ok): the check passes.
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("validate 1/2 (0%) ddp/fp32/wrap=none batch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("validate 2/2 (50%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("validate 1/2"), std::string::npos);
}

TEST(Progress, PlanSaysWhichCandidateItIsAt) {
  // At info a plan logs at most one line a second (a quick plan none); at
  // debug every traced step and every candidate, on stderr.
  const Result r =
      shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "32", "--gpus", "2", "--device", "cpu",
                "--gpu-mem", "12MiB", "--precision", "fp32", "--log-level", "debug"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("plan: traced step 1/"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("plan: candidate 1/"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(100%)"), std::string::npos) << r.err;  // the last candidate
  EXPECT_EQ(r.out.find("plan: candidate"), std::string::npos) << r.out;
}

TEST(PlanTop, PrintsTheBestRowsAndSaysHowManyAreLeft) {
  const Result r =
      shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "32", "--gpus", "2", "--device", "cpu",
                "--gpu-mem", "12MiB", "--precision", "fp32", "--top", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("more candidates (--top 0 shows all)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("usable memory 12.00 MiB per GPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reserved MiB"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardfit::cli_test
