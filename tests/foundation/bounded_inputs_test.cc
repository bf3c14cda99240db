// Bounded inputs: every kind of out-of-range input is exit 2 with one
// line on stderr naming the input, fast, before anything trains or forks.
// One test per kind, named after it. The binary as a subprocess (bounded
// by timeout(1)); no LibTorch in this file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/shardfit_process.h"

namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;

fs::path dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = fs::temp_directory_path() / (std::string("shardfit_bounds_") + info->name() +
                                                  "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

using shardfit::test_support::read_file;
using shardfit::test_support::Result;

// Bounded: timeout(1) ends a run that would hang after 60 s.
Result shardfit(const Args& args) { return shardfit::test_support::shardfit(args, "", 60); }
Result expect_bad_input(const Args& args, const std::string& needle) {
  return shardfit::test_support::expect_bad_input(args, needle, "", 60);
}

std::string config(const std::string& body) {
  const fs::path p = dir() / "config.json";
  std::ofstream(p) << body;
  return p.string();
}

// `run` of a model config (one step): the config's checks come first.
Args run_model(const std::string& model) {
  return {"run", "--model", model, "--steps", "1", "--seq-len", "8"};
}

Args run_tiny(const Args& more) {
  Args a = {"run", "--model", "gpt2-tiny", "--steps", "1", "--seq-len", "16"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(BoundedInputs, NprocAboveTheCoresNeedsOversubscribe) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  expect_bad_input(run_tiny({"--nproc", std::to_string(cores + 1)}), "--oversubscribe");
  // Never a fork bomb, --oversubscribe or not.
  const Result r = expect_bad_input(run_tiny({"--nproc", "100000", "--oversubscribe"}), "--nproc");
  EXPECT_LT(r.seconds, 10);
}

TEST(BoundedInputs, ConfigWithNLayer1e9IsExitTwoInUnderASecondNamingTheKey) {
  const std::string cfg = config(R"({"model_type": "gpt2", "n_layer": 1000000000})");
  // The binary's own start (loading LibTorch) is the floor; the check adds
  // well under a second to it (it used to take 54 s and all memory).
  const double start_up = shardfit({"models"}).seconds;
  const Result r = expect_bad_input({"plan", "--model", cfg, "--device", "cpu"}, "'n_layer'");
  EXPECT_LT(r.seconds, start_up + 1.0);
  expect_bad_input(run_model(config(R"({"model_type": "gpt2", "n_layer": 100000})")), "'n_layer'");
}

TEST(BoundedInputs, ConfigWithNEmbd1e9IsExitTwo) {
  expect_bad_input(
      {"plan", "--model", config(R"({"model_type": "gpt2", "n_embd": 1000000000, "n_head": 1})"),
       "--device", "cpu"},
      "'n_embd'");
}

TEST(BoundedInputs, ConfigWithVocab2Pow63Minus1IsExitTwo) {
  expect_bad_input(
      {"plan", "--model", config(R"({"model_type": "gpt2", "vocab_size": 9223372036854775807})"),
       "--device", "cpu"},
      "'vocab_size'");
}

TEST(BoundedInputs, ConfigWithNegativeInitializerRangeIsExitTwo) {
  expect_bad_input(run_model(config(R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 64,
                                                  "n_head": 4, "vocab_size": 512, "n_positions": 64,
                                                  "initializer_range": -0.02})")),
                   "'initializer_range'");
}

TEST(BoundedInputs, ConfigWithNegativeLayerNormEpsilonIsExitTwo) {
  expect_bad_input(run_model(config(R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 64,
                                                  "n_head": 4, "vocab_size": 512, "n_positions": 64,
                                                  "layer_norm_epsilon": -1e-5})")),
                   "'layer_norm_epsilon'");
}

TEST(BoundedInputs, ConfigWithTypeVocabSize1IsExitTwo) {
  expect_bad_input(run_model(config(R"({"model_type": "bert", "num_hidden_layers": 1,
                                                  "hidden_size": 64, "num_attention_heads": 4,
                                                  "intermediate_size": 128, "vocab_size": 512,
                                                  "max_position_embeddings": 64, "type_vocab_size": 1})")),
                   "'type_vocab_size'");
}

TEST(BoundedInputs, LrInfIsExitTwo) {
  expect_bad_input(run_tiny({"--lr", "inf"}), "--lr");
  expect_bad_input(run_tiny({"--lr", "nan"}), "--lr");
}

TEST(BoundedInputs, GpuMemZeroOrEmptyIsExitTwo) {
  expect_bad_input(run_tiny({"--gpu-mem", "0"}), "--gpu-mem");
  expect_bad_input(run_tiny({"--gpu-mem", ""}), "--gpu-mem");
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "0"},
                   "--gpu-mem");
}

TEST(BoundedInputs, SeedAbove2Pow64Minus1IsExitTwoNotClamped) {
  expect_bad_input(run_tiny({"--seed", "18446744073709551616"}), "--seed");
  expect_bad_input(run_tiny({"--seed", "-1"}), "--seed");
}

TEST(BoundedInputs, TimeoutInfIsExitTwoOnOneLine) {
  expect_bad_input(run_tiny({"--timeout", "inf", "--nproc", "1"}), "--timeout");
  expect_bad_input(run_tiny({"--timeout", "1e300"}), "--timeout");
}

TEST(BoundedInputs, Batch1099511627776IsExitTwo) {
  expect_bad_input(run_tiny({"--batch", "1099511627776"}), "--batch");
}

TEST(BoundedInputs, ValidateSteps0IsExitTwo) {
  expect_bad_input({"validate", "--plan", "p.json", "--steps", "0"}, "--steps");
}

TEST(BoundedInputs, ValidateOutDirFileAndCudaPlanOnCpuBuildAreExitTwo) {
  const fs::path d = dir();
  const std::string plan = (d / "cpu.json").string(), cuda = (d / "cuda.json").string();
  ASSERT_EQ(shardfit({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "64MiB",
                      "--seq-len", "32", "--strategies", "ddp/fp32/wrap=none", "--out", plan})
                .exit_code,
            0);
  std::ofstream(d / "file") << "x";
  expect_bad_input({"validate", "--plan", plan, "--out-dir", (d / "file").string()}, "--out-dir");
  // A CUDA card's plan validated with CPU ranks would train its batch on
  // the CPU and compare against the card's allocator model: refused.
  ASSERT_EQ(shardfit({"plan", "--model", "gpt2-tiny", "--device", "titan-rtx-24gb", "--seq-len",
                      "32", "--strategies", "ddp/fp32/wrap=none", "--out", cuda})
                .exit_code,
            0);
  expect_bad_input({"validate", "--plan", cuda, "--out-dir", (d / "v").string()}, "titan-rtx-24gb");
  fs::remove_all(d);
}

TEST(BoundedInputs, CompareWithEmptyRanksOrBadMaxPeakErrorIsExitTwo) {
  const fs::path d = dir();
  const std::string report = (d / "r.json").string();
  ASSERT_EQ(shardfit(run_tiny({"--out", report})).exit_code, 0);
  expect_bad_input({"compare", report, "--max-peak-error", "-1"}, "--max-peak-error");
  expect_bad_input({"compare", report, "--max-peak-error", "nan"}, "--max-peak-error");
  std::string text = read_file(report);
  const size_t at = text.find("\"ranks\": [");
  ASSERT_NE(at, std::string::npos);
  // Cut the ranks array down to [].
  size_t depth = 0, end = at + 9;
  for (; end < text.size(); ++end) {
    if (text[end] == '[') ++depth;
    if (text[end] == ']' && --depth == 0) break;
  }
  text = text.substr(0, at) + "\"ranks\": []" + text.substr(end + 1);
  std::ofstream(d / "empty.json") << text;
  expect_bad_input({"compare", (d / "empty.json").string()}, "ranks");
  fs::remove_all(d);
}

}  // namespace
