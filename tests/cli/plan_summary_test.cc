// `plan`'s default output (each strategy family's best and why), `--all`,
// and sweeps: lists given to --seq-len, --gpus, --nodes and --gpu-mem.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

// fp32: bf16 on a CPU is traced at every batch tried (oneDNN's scratchpads), seconds a plan.
const std::vector<std::string> kTiny = {"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "24MiB", "--precision", "fp32",
                                        "--log-level", "warn"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// A CPU has no memory figure of its own: without --gpu-mem every batch
// fits, and a bf16 candidate would be traced, its matrix products run for
// real, at the search's cap. Refused before any trace; fp32 alone plans.
TEST(PlanCommand, ACpuPlanWithBf16CandidatesNeedsEachRanksMemory) {
  const std::vector<std::string> cpu = {"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpus", "2"};
  expect_bad_input(cpu, "--gpu-mem");
  expect_bad_input(with(cpu, {"--precision", "bf16"}), "--precision fp32");
  const Result fp32 = shardfit(with(cpu, {"--precision", "fp32", "--strategies", "ddp/fp32/wrap=none"}));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("search capped at batch 4096"), std::string::npos) << fp32.out;
}

TEST(PlanCommand, DefaultShowsEachFamilysBestAndWhyAllShowsEveryRow) {
  const Result summary = shardfit(with(kTiny, {"--gpus", "2"}));
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("best of each strategy"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("why: "), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("Runner-up (another strategy)"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("--all lists all"), std::string::npos) << summary.out;
  const Result all = shardfit(with(kTiny, {"--gpus", "2", "--all"}));
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.out.find("* chosen: "), std::string::npos) << all.out;
  // The plan JSON has every candidate; --all's table a row for each, the
  // summary one per family.
  const Result json = shardfit(with(kTiny, {"--gpus", "2", "--json"}));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const size_t candidates = nlohmann::json::parse(json.out)["candidates"].size();
  EXPECT_EQ(count_lines(all.out), candidates + 3) << all.out;  // setup, titles, rows, chosen
  EXPECT_LT(count_lines(summary.out), candidates) << summary.out;
  // The summary's chosen row is the plan's chosen candidate.
  const std::string chosen = nlohmann::json::parse(json.out)["chosen"];
  EXPECT_NE(summary.out.find("*  " + chosen), std::string::npos) << summary.out;
  expect_bad_input(with(kTiny, {"--all", "--json"}), "--all");
}

TEST(PlanCommandSweep, ListsGiveOnePlanPerCombination) {
  const std::string out = temp_path("sweep.json");
  const Result r = shardfit(with(kTiny, {"--seq-len", "32,64", "--gpus", "1,2", "--out", out}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_lines(r.out), 2u + 4u) << r.out;  // title, header, 2 x 2 points
  EXPECT_NE(r.out.find("largest batch per GPU each sharding fits"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(read_file(out));
  EXPECT_EQ(j["schema"], "shardfit.plan-sweep/1");
  ASSERT_EQ(j["plans"].size(), 4u);
  // Nested in the options' order: seq len outermost.
  EXPECT_EQ(j["plans"][1]["model"]["seq_len"], 32);
  EXPECT_EQ(j["plans"][1]["hardware"]["gpus_per_node"], 2);
  EXPECT_EQ(j["plans"][2]["model"]["seq_len"], 64);
  // Each point is the plan a single run gives.
  const Result one = shardfit(with(kTiny, {"--seq-len", "64", "--gpus", "2", "--json"}));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(nlohmann::json::parse(one.out), j["plans"][3]);
  // --json prints the same document.
  const Result json = shardfit(with(kTiny, {"--seq-len", "32,64", "--gpus", "1,2", "--json"}));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out), j);
}

TEST(PlanCommandSweep, BadListsAreOneLineExitTwo) {
  expect_bad_input(with(kTiny, {"--gpus", "2,,4"}), "--gpus");
  expect_bad_input(with(kTiny, {"--gpus", "2,0"}), "--gpus");
  expect_bad_input(with(kTiny, {"--nodes", "1,x"}), "--nodes");
  expect_bad_input(with(kTiny, {"--seq-len", "64,"}), "--seq-len");
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "24MiB,0"}, "--gpu-mem");
  expect_bad_input(with(kTiny, {"--gpus", "1,2", "--all"}), "--all");
  expect_bad_input(with(kTiny, {"--gpus", "1,2", "--top", "3"}), "--top");
  // 17 x 16 points: over the cap, refused before any is planned.
  std::string many = "1";
  for (int i = 2; i <= 17; ++i) many += "," + std::to_string(i);
  expect_bad_input(with(kTiny, {"--gpus", many, "--seq-len", "8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23"}),
                   "at most 256");
  // No point fits: exit 2, after the grid.
  const Result none = shardfit({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "64KiB,128KiB",
                                "--log-level", "warn"});
  EXPECT_EQ(none.exit_code, 2) << none.err;
  EXPECT_NE(none.err.find("at any point of the sweep"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace shardfit::cli_test
