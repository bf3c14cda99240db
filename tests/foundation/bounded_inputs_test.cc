// Bad input, each case found by trying: exit 2 with one
// line on stderr naming the input, fast, before anything trains or forks.
// One test per defect, named after it. The binary as a subprocess (bounded
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
  const fs::path d = shardfit::test_support::scratch_root() / (std::string("bounds_") + info->name());
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

// A list option with an empty item names nothing where the item stands: it
// was read as the default (every strategy, every precision) without a word.
TEST(BoundedInputs, EmptyListItemsAreExitTwo) {
  for (const char* list : {"", ",,", "ddp,,zero3"})
    expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--strategies", list}, "--strategies");
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--precision", "fp32,,bf16"}, "--precision");
  // validate --candidates '' validated every candidate and ',,' none, with exit 0.
  for (const char* list : {"", ",,", "ddp/fp32/wrap=none,,"})
    expect_bad_input({"validate", "--plan", "p.json", "--candidates", list}, "--candidates");
}

// Job sizes past any real job are refused at once: --grad-accum 99999999
// planned for ever, and --gpus 2147483647 or --nodes 99999999 planned.
TEST(BoundedInputs, JobSizesPastARealJobAreExitTwo) {
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--grad-accum", "99999999"}, "--grad-accum");
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpus", "2147483647"}, "--gpus");
  expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--nodes", "99999999"}, "--nodes");
  expect_bad_input(run_tiny({"--grad-accum", "99999999"}), "--grad-accum");
}

// Output files are checked before the work, not after: `run --out
// /dev/full` exited 0 with the report lost, `--export /proc/...` and
// `calibrate --out` failed with exit 3 after minutes.
TEST(BoundedInputs, OutputFilesThatCannotBeWrittenAreExitTwoBeforeTheWork) {
  const fs::path d = dir();
  for (const std::string& out : {std::string("/dev/full"), d.string(), std::string("/proc/shardfit-report.json"),
                                 (d / "missing" / "r.json").string()}) {
    const Result r = expect_bad_input(run_tiny({"--out", out}), "--out");
    EXPECT_EQ(r.out.find("loss"), std::string::npos) << out << ": it trained first";
  }
  expect_bad_input(run_tiny({"--nproc", "1", "--save", (d / "k").string(), "--export", "/proc/x.safetensors"}),
                   "--export");
  const Result c = expect_bad_input({"calibrate", "--device", "cpu", "--out", "/dev/full"}, "--out");
  EXPECT_LT(c.seconds, 10.0) << "calibrate measured before checking --out";
  fs::remove_all(d);
}

// Options of one mode given without it were ignored without a word; a
// timeout under a millisecond was accepted and then refused by every rank.
TEST(BoundedInputs, OptionsWithoutTheirModeAndSubMillisecondTimeoutsAreExitTwo) {
  expect_bad_input(run_tiny({"--rank", "1"}), "--rank");
  expect_bad_input(run_tiny({"--world-size", "4"}), "--world-size");
  expect_bad_input(run_tiny({"--candidate", "zero3/fp32/wrap=block"}), "--candidate");
  expect_bad_input(run_tiny({"--timeout", "1e-300"}), "--timeout");
  expect_bad_input(run_tiny({"--oversubscribe"}), "--oversubscribe");
  EXPECT_EQ(shardfit(run_tiny({"--backend", "loopback", "--world-size", "2", "--rank", "1"})).exit_code, 0);
}

// A plan file is input too: its max batch of 1e12 ended in std::bad_alloc,
// and a plan for SGD ran AdamW without a word.
TEST(BoundedInputs, PlanFilesPastAnyPlanOrForAnotherOptimizerAreExitTwo) {
  const fs::path d = dir();
  const std::string plan = (d / "plan.json").string();
  ASSERT_EQ(shardfit({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "64MiB", "--strategies",
                      "ddp/fp32/wrap=none", "--seq-len", "16", "--out", plan})
                .exit_code,
            0);
  const std::string text = read_file(plan);
  auto edited = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    const fs::path p = d / ("edited" + std::to_string(at) + ".json");
    std::ofstream(p) << text.substr(0, at) + to + text.substr(at + from.size());
    return p.string();
  };
  const size_t mb = text.find("\"max_batch_per_gpu\": ");
  ASSERT_NE(mb, std::string::npos);
  const std::string max_field = text.substr(mb, text.find_first_of(",\n}", mb) - mb);
  expect_bad_input({"run", "--plan", edited(max_field, "\"max_batch_per_gpu\": 1000000000000"), "--steps", "1"},
                   "max_batch_per_gpu");
  expect_bad_input({"run", "--plan", edited("\"optimizer\": \"adamw\"", "\"optimizer\": \"sgd\""), "--steps", "1"},
                   "sgd");
  expect_bad_input({"run", "--plan", edited("\"optimizer\": \"adamw\"", "\"optimizer\": \"lion\""), "--steps", "1"},
                   "optimizer");
  fs::remove_all(d);
}

// A file, directory or name option given '' was read as not given, without
// a word: --resume '' trained from scratch, --out '' wrote no report,
// --candidate '' ran the chosen one, --baseline '' compared with none.
TEST(BoundedInputs, EmptyValuesOfFileAndNameOptionsAreExitTwo) {
  for (const char* opt : {"--model", "--out", "--plan", "--candidate", "--profile", "--data", "--save", "--resume",
                          "--export", "--init"})
    expect_bad_input(run_tiny({opt, ""}), opt);
  for (const char* opt : {"--model", "--trace", "--out"})
    expect_bad_input({"plan", "--device", "cpu", opt, ""}, opt);
  expect_bad_input({"compare", "r.json", "--baseline", ""}, "--baseline");
  expect_bad_input({"report", "r.json", "-o", "", "--plan", "p.json"}, "--out");
  expect_bad_input({"report", "r.json", "-o", "r.md", "--plan", ""}, "--plan");
  expect_bad_input({"export-config", "--plan", "p.json", "--format", "fsdp", "--out", ""}, "--out");
  expect_bad_input({"validate", "--plan", "p.json", "--out-dir", ""}, "--out-dir");
  expect_bad_input({"calibrate", "--device", "cpu", "--out", ""}, "--out");
}

// plan --out was checked after the plan (seconds to minutes) and `report
// -o` through a link to /dev/full exited 0 with the report lost; `plan`,
// `report` and `export-config` now check their output before the work.
TEST(BoundedInputs, PlanReportAndExportConfigOutputsAreCheckedBeforeTheWork) {
  const fs::path d = dir();
  const fs::path full = d / "full.md";
  fs::create_symlink("/dev/full", full);
  for (const std::string& out : {std::string("/dev/full"), d.string(), std::string("/proc/plan.json"),
                                 (d / "missing" / "p.json").string(), full.string()}) {
    const Result r = expect_bad_input({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--out", out}, "--out");
    EXPECT_LT(r.seconds, 10.0) << out << ": planned before checking --out";
  }
  const std::string report = (d / "r.json").string(), plan = (d / "p.json").string();
  ASSERT_EQ(shardfit(run_tiny({"--out", report})).exit_code, 0);
  expect_bad_input({"report", report, "-o", full.string()}, "-o");
  fs::create_directories(d / "dir.md");
  expect_bad_input({"report", report, "-o", (d / "dir.md").string()}, "-o");
  ASSERT_EQ(shardfit({"plan", "--model", "gpt2-tiny", "--device", "cpu", "--gpu-mem", "64MiB", "--strategies",
                      "zero3/fp32/wrap=block", "--seq-len", "16", "--out", plan})
                .exit_code,
            0);
  expect_bad_input({"export-config", "--plan", plan, "--format", "fsdp", "--out", "/dev/full"}, "--out");
  fs::remove_all(d);
}

// A write that fails after the work (here the file-size limit, as a full disk
// would) is the environment's failure: exit 3 and one line naming the output,
// never exit 0 with the file lost, and nothing truncated left under its name.
TEST(BoundedInputs, AnOutputWriteThatFailsAfterTheWorkIsExitThree) {
  const fs::path d = dir();
  const std::string report = (d / "r.json").string(), html = (d / "r.html").string();
  ASSERT_EQ(shardfit(run_tiny({"--out", report})).exit_code, 0);
  // sh's ulimit -f counts 512-byte blocks: 4 KiB, below the page's size;
  // SIGXFSZ ignored so the write fails instead of killing the process.
  const Result r = shardfit::test_support::shardfit({"report", report, "-o", html}, "trap '' XFSZ; ulimit -f 8;", 60);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("-o " + html), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_FALSE(fs::exists(html)) << "a truncated page was left under the name";
  fs::remove_all(d);
}

// torchrun's variables are read once, bounded, before the world size is
// taken from them: WORLD_SIZE=abc was read as 0 and reported as the
// strategy's "world size 0".
TEST(BoundedInputs, TorchrunVariablesAreNamedWhenMalformed) {
  using shardfit::test_support::expect_bad_input;
  for (const std::string world : {"abc", "-1", "99999999999"})
    expect_bad_input(run_tiny({}), "WORLD_SIZE=" + world, "RANK=0 WORLD_SIZE=" + world, 60);
  expect_bad_input(run_tiny({}), "LOCAL_WORLD_SIZE=x",
                   "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=x MASTER_ADDR=127.0.0.1 MASTER_PORT=29500", 60);
  // --oversubscribe lets --nproc's local ranks exceed the cores; under
  // torchrun it would be ignored without a word.
  expect_bad_input(run_tiny({"--oversubscribe"}), "the launcher placed the ranks",
                   "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500", 60);
}

}  // namespace
