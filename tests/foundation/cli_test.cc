// The shardfit binary as a user or a script sees it: run as a subprocess,
// its exit code, stdout and stderr checked against SPEC's contract (0 done,
// 2 bad input with exactly one line on stderr naming the input). No LibTorch
// in this file, so it compiles in a couple of seconds.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reports/run_report.h"

#include "tests/support/shardfit_process.h"

namespace {

using shardfit::test_support::expect_bad_input;
using shardfit::test_support::read_file;
using shardfit::test_support::Result;
using shardfit::test_support::shardfit;
using shardfit::test_support::temp_path;

TEST(CliTest, ModelsJsonListsExactCounts) {
  const Result r = shardfit({"models", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, int64_t> params;
  for (const auto& m : j) params[m.at("name").get<std::string>()] = m.at("params").get<int64_t>();
  const std::map<std::string, int64_t> expected = {
      {"gpt2", 124439808},     {"gpt2-medium", 354823168}, {"gpt2-large", 774030080},
      {"gpt2-xl", 1557611200}, {"bert-base", 109483778},   {"bert-large", 335143938},
  };
  for (const auto& [name, count] : expected) {
    ASSERT_TRUE(params.count(name)) << name;
    EXPECT_EQ(params[name], count) << name;
  }
  EXPECT_TRUE(params.count("gpt2-tiny"));
  EXPECT_TRUE(params.count("bert-tiny"));
}

TEST(CliTest, ModelsTableShowsExactCounts) {
  const Result r = shardfit({"models"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("1557611200"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bert-large"), std::string::npos) << r.out;
}

TEST(CliTest, RunWritesAReport) {
  const std::string report = temp_path("report.json");
  const Result r = shardfit(
      {"run", "--model", "gpt2-tiny", "--steps", "3", "--batch", "2", "--out", report});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_file(report);
  std::remove(report.c_str());
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
  EXPECT_EQ(j.at("schema"), "shardfit.report/1");
  // The report reads back through the same schema check `compare` uses.
  shardfit::reports::RunReport rep;
  ASSERT_NO_THROW(rep = shardfit::reports::report_from_json(j, report));
  ASSERT_EQ(rep.loss.size(), 3u);
  for (double l : rep.loss) EXPECT_TRUE(l > 0 && l < 10) << l;  // ~ln 512 = 6.2 untrained
  EXPECT_EQ(rep.steps, 3);
  EXPECT_EQ(rep.batch_per_gpu, 2);
  EXPECT_EQ(rep.world_size, 1);
  EXPECT_EQ(rep.model.at("name"), "gpt2-tiny");
  ASSERT_EQ(rep.ranks.size(), 1u);
  EXPECT_GT(rep.ranks[0].measured.peak_allocated_bytes, 4 * rep.model.at("params").get<int64_t>());
  ASSERT_FALSE(rep.ranks[0].measured.timeline.empty());
  EXPECT_EQ(rep.ranks[0].measured.timeline.front().label, "init");
  EXPECT_EQ(rep.ranks[0].measured.timeline.back().label, "step3/optimizer");
  EXPECT_GT(rep.tokens_per_s, 0);
}

TEST(CliTest, EverySubcommandHasHelp) {
  for (const char* sub : {"models", "run"}) {
    const Result r = shardfit({sub, "--help"});
    EXPECT_EQ(r.exit_code, 0) << sub << ": " << r.err;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
  const Result r = shardfit({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("run"), std::string::npos);
}

TEST(CliTest, BadInputIsExitTwoWithOneLineNamingIt) {
  expect_bad_input({"run", "--model", "gpt5-mini", "--steps", "1"}, "gpt5-mini");
  expect_bad_input({"run", "--model", "gpt2-tiny", "--batch", "0"}, "--batch");
  expect_bad_input({"run", "--model", "gpt2-tiny", "--frobnicate", "3"}, "--frobnicate");
  expect_bad_input({"run", "--model", "gpt2-tiny", "--steps", "1", "--data",
                    "/nonexistent/tokens.bin"},
                   "/nonexistent/tokens.bin");
  expect_bad_input({"run", "--model", "gpt2-tiny", "--device", "tpu"}, "tpu");
}

// The device and backend checks of `run`, before anything trains. In a CPU
// LibTorch build --device cuda and --backend nccl are bad input; with a
// CUDA LibTorch (--version says which) the mismatched pairs still are.
TEST(CliTest, DevicesAndBackendsThisBuildCannotRunAreExitTwo) {
  const Result help = shardfit({"run", "--help"});
  ASSERT_EQ(help.exit_code, 0) << help.err;
  // Where the CUDA path's figures were checked on a card.
  EXPECT_NE(help.out.find("reports/gpu/README.md"), std::string::npos) << help.out;
  const Result version = shardfit({"--version"});
  const bool cuda_build = version.out.find("CUDA: yes") != std::string::npos;
  const std::vector<std::string> tiny = {"run", "--model", "gpt2-tiny", "--steps", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = tiny;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  // nccl reduces CUDA tensors: never with CPU ranks, and not at all without
  // a CUDA LibTorch (or without NCCL) in the build.
  expect_bad_input(with({"--backend", "nccl"}), "--backend nccl");
  expect_bad_input(with({"--backend", "nccl", "--device", "cpu", "--nproc", "2"}), "--backend nccl");
  if (!cuda_build) {
    expect_bad_input(with({"--device", "cuda"}), "--device cuda");
    expect_bad_input(with({"--device", "cuda", "--backend", "loopback", "--world-size", "2"}), "--device cuda");
    expect_bad_input(with({"--device", "cuda", "--backend", "nccl"}), "--device cuda");
  } else {
    expect_bad_input(with({"--device", "cuda", "--backend", "gloo"}), "--backend gloo");
    expect_bad_input(with({"--device", "cuda", "--reference-trainer"}), "--reference-trainer");
    expect_bad_input(with({"--device", "cuda", "--profile", "cpu"}), "--profile cpu");
  }
  // The prediction's profile describes the device measured: cpu on the CPU.
  expect_bad_input(with({"--profile", "titan-rtx-24gb"}), "--profile titan-rtx-24gb");
  // The CPU has no caching allocator to record.
  expect_bad_input(with({"--allocator-history", "h.json"}), "--allocator-history h.json");
}

TEST(CliTest, ACpuRunReportsTheCpuDeviceAndProfile) {
  const std::string report = temp_path("report.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--steps", "1", "--profile", "cpu", "--out", report});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_file(report));
  std::remove(report.c_str());
  EXPECT_EQ(j.at("run").at("device"), "cpu");
  EXPECT_EQ(j.at("hardware").at("profile"), "cpu");
  // CPU: nothing is cached, reserved is allocated.
  const auto& measured = j.at("ranks").at(0).at("measured");
  EXPECT_EQ(measured.at("peak_reserved_bytes"), measured.at("peak_allocated_bytes"));
}

TEST(CliTest, UnknownSubcommandIsExitTwoNamingIt) {
  expect_bad_input({"frobnicate"}, "frobnicate");
  expect_bad_input({"frobnicate", "--model", "gpt2"}, "frobnicate");
}

TEST(CliTest, MalformedConfigJsonIsExitTwoNamingTheFile) {
  const std::string config = temp_path("config.json");
  std::ofstream(config) << R"({"model_type": "gpt2", "n_embd": )";
  expect_bad_input({"run", "--model", config, "--steps", "1"}, config);
  std::ofstream(config) << R"({"model_type": "t5"})";  // not a family shardfit builds
  expect_bad_input({"run", "--model", config, "--steps", "1"}, config);
  std::remove(config.c_str());
  expect_bad_input({"run", "--model", config, "--steps", "1"}, config);  // now missing
}

TEST(CliTest, RunFromAConfigJson) {
  const std::string config = temp_path("config.json");
  std::ofstream(config) << R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2,
                               "vocab_size": 256, "n_positions": 16})";
  const std::string report = temp_path("report.json");
  const Result r = shardfit({"run", "--model", config, "--steps", "2", "--out", report});
  std::remove(config.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(read_file(report));
  std::remove(report.c_str());
  EXPECT_EQ(j.at("run").at("loss").size(), 2u);
  EXPECT_EQ(j.at("model").at("seq_len"), 16);  // min(128, n_positions)
}

// A bf16 plan on the CPU runs LibTorch's own matmul kernels once per product
// shape to see what they allocate (planner/cpu_matmul_probe.cc); what they
// did is kept under SHARDFIT_CACHE_DIR, so the next plan runs none of them
// and plans the same.
TEST(CliTest, ABf16CpuPlanKeepsItsMatmulProbesForTheNextOne) {
  const std::string dir = temp_path("probe-cache");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(setenv("SHARDFIT_CACHE_DIR", dir.c_str(), 1), 0);
  const std::vector<std::string> plan = {"plan",   "--model",    "gpt2-tiny", "--device", "cpu", "--strategies",
                                         "ddp/bf16/wrap=none", "--gpus", "1", "--gpu-mem", "64MiB", "--json"};
  auto planned = [&](const char* what) {
    const Result r = shardfit(plan);
    EXPECT_EQ(r.exit_code, 0) << what << ": " << r.err;
    const auto c = nlohmann::json::parse(r.out).at("candidates").at(0);
    return std::make_pair(c.at("max_batch_per_gpu").get<int64_t>(),
                          c.at("predicted").at("peak_allocated_bytes").get<int64_t>());
  };
  const auto first = planned("first plan");
  const std::string file = dir + "/cpu-bf16-matmul-probes.tsv";
  const std::string kept = read_file(file);
  ASSERT_FALSE(kept.empty()) << file;
  EXPECT_EQ(planned("from the kept probes"), first);
  EXPECT_EQ(read_file(file), kept) << "every probe came from the file: none was run again";
  // A line that does not parse is skipped, not believed; so is a last line
  // another process is still writing (no newline yet). Here that line gives a
  // product of the max batch (its rows: batch x 128 tokens) a 1 GB
  // scratchpad: once its newline is written, it is believed, and that batch
  // no longer fits.
  const std::string machine = kept.substr(0, kept.find('\t'));
  const std::string rows = "|BFloat16 " + std::to_string(first.first * 128) + " ";
  const size_t at = kept.find(rows);
  ASSERT_NE(at, std::string::npos) << "no product of batch " << first.first << " kept";
  const size_t line_start = kept.rfind('\n', at) == std::string::npos ? 0 : kept.rfind('\n', at) + 1;
  const std::string product = kept.substr(line_start, kept.find('\t', kept.find('\t', line_start) + 1) - line_start);
  std::ofstream(file, std::ios::app) << machine << "\tno such product\tnot-a-number\n" << product << "\t1000000000";
  EXPECT_EQ(planned("beside a malformed line and a partial one"), first);
  std::ofstream(file, std::ios::app) << "\n";
  EXPECT_LT(planned("with that line whole").first, first.first);
  unsetenv("SHARDFIT_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
