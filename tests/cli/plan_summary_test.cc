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

// A candidate that fits no batch is predicted at batch 1 with no memory
// limit, which the summary names for the least of them: given that much,
// batch 1 fits (exactly that much on a CPU; on a GPU the caching allocator,
// which frees its cache under a tighter limit, may fit it in less).
TEST(PlanCommand, ACandidateThatFitsNoBatchSaysWhatBatchOneNeeds) {
  const std::vector<std::string> tight = {"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "1MiB",
                                          "--precision", "fp32", "--strategies", "ddp/fp32/wrap=none",
                                          "--log-level", "warn"};
  const Result text = shardfit(tight);
  EXPECT_EQ(text.exit_code, 2) << text.err;
  EXPECT_NE(text.out.find("(the least, ddp/fp32/wrap=none, fits batch 1 in "), std::string::npos) << text.out;
  const Result json = shardfit(with(tight, {"--json"}));
  const auto c = nlohmann::json::parse(json.out)["candidates"][0];
  ASSERT_EQ(c["max_batch_per_gpu"], 0) << json.out;
  const int64_t needs = c["predicted"]["peak_reserved_bytes"];
  EXPECT_GT(needs, int64_t{1} << 20) << json.out;
  EXPECT_GT(c["oom"]["request_bytes"].get<int64_t>(), 0) << json.out;  // the allocation that fails in 1 MiB
  std::vector<std::string> enough = tight;
  enough[6] = std::to_string(needs);
  const Result fits = shardfit(with(enough, {"--json"}));
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_EQ(nlohmann::json::parse(fits.out)["candidates"][0]["max_batch_per_gpu"], 1) << fits.out;
  enough[6] = std::to_string(needs - 1);  // and on a CPU not a byte less
  EXPECT_EQ(nlohmann::json::parse(shardfit(with(enough, {"--json"})).out)["candidates"][0]["max_batch_per_gpu"], 0);
  // On a GPU the allocator's budget is --gpu-mem less the CUDA context and
  // NCCL's buffers: batch 1 needs its reserved bytes and those.
  const std::vector<std::string> gpu = {"plan", "--model", "gpt2", "--device", "a100-80gb", "--gpus", "2",
                                        "--gpu-mem", "1GiB", "--strategies", "zero3/fp32/wrap=block",
                                        "--log-level", "warn", "--json"};
  const auto small = nlohmann::json::parse(shardfit(gpu).out);
  ASSERT_EQ(small["candidates"][0]["max_batch_per_gpu"], 0) << small.dump();
  const int64_t outside = small["hardware"]["device_mem_bytes"].get<int64_t>() -
                          small["hardware"]["allocator_budget_bytes"].get<int64_t>();
  std::vector<std::string> gpu_enough = gpu;
  gpu_enough[8] = std::to_string(small["candidates"][0]["predicted"]["peak_reserved_bytes"].get<int64_t>() + outside);
  const Result gpu_fits = shardfit(gpu_enough);
  ASSERT_EQ(gpu_fits.exit_code, 0) << gpu_fits.err;
  EXPECT_GE(nlohmann::json::parse(gpu_fits.out)["candidates"][0]["max_batch_per_gpu"], 1) << gpu_fits.out;
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
