// `shardfit run --save / --resume / --export` as a user drives them: real
// ranks (--nproc 2, gloo), the binary as a subprocess. No LibTorch here
// (safetensors and reports are read by hand), so it compiles in seconds.
//
// What a user checks of a checkpoint:
//  - resuming continues the same loss curve: the losses of steps k+1..n of a
//    resumed run equal, bit for bit, those of the run that never stopped;
//  - the round trip is bit-exact: the checkpoint a resumed run writes at
//    step n is byte for byte the one the uninterrupted run writes;
//  - a rank killed mid-run loses nothing committed: --resume DIR picks the
//    latest committed step and finishes the same curve;
//  - the export is one safetensors file with Hugging Face GPT-2 names and
//    shapes, the same model whichever sharding wrote it;
//  - bad checkpoint options are exit 2 with one line naming the input.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/shardfit_process.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path test_dir() { return shardfit::test_support::test_dir("ckpt"); }
using shardfit::test_support::read_file;
using shardfit::test_support::Result;

Result shardfit(const fs::path&, const std::vector<std::string>& args, const std::string& env = "") {
  return shardfit::test_support::shardfit(args, env);
}

// gpt2-tiny on two gloo ranks: dropout on (the default 0.1), so the saved
// generator state matters as much as the weights.
std::vector<std::string> job(const std::string& strategy, int steps) {
  return {"run",        "--model",  "gpt2-tiny", "--strategy", strategy, "--nproc", "2", "--batch", "2",
          "--seq-len",  "32",       "--steps",   std::to_string(steps), "--timeout", "60"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

json run_ok(const fs::path& dir, const std::vector<std::string>& args, const std::string& report,
            const std::string& env = "") {
  const Result r = shardfit(dir, args + std::vector<std::string>{"--out", (dir / report).string()}, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  if (r.exit_code != 0) return json();
  return json::parse(read_file(dir / report));
}

std::vector<double> losses(const json& report) { return report.at("run").at("loss").get<std::vector<double>>(); }

// Every file of a committed checkpoint, byte for byte.
std::map<std::string, std::string> checkpoint_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files[e.path().filename().string()] = read_file(e.path());
  return files;
}

struct SafeTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;  // F32 only
};

// safetensors: u64 little-endian header length, JSON header, data.
std::map<std::string, SafeTensor> read_safetensors(const fs::path& path) {
  const std::string bytes = read_file(path);
  EXPECT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  const size_t data = 8 + n;
  std::map<std::string, SafeTensor> out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    SafeTensor st;
    st.dtype = t.at("dtype");
    st.shape = t.at("shape").get<std::vector<int64_t>>();
    const auto offs = t.at("data_offsets").get<std::vector<uint64_t>>();
    if (st.dtype == "F32") {
      st.values.resize((offs[1] - offs[0]) / 4);
      std::memcpy(st.values.data(), bytes.data() + data + offs[0], offs[1] - offs[0]);
    }
    out[name] = std::move(st);
  }
  return out;
}

void expect_bad_input(const fs::path& dir, const std::vector<std::string>& args, const std::string& names) {
  const Result r = shardfit(dir, args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(names), std::string::npos) << "does not name '" << names << "': " << r.err;
}

class ResumeTest : public ::testing::TestWithParam<const char*> {};

// Steps 1..6 straight (saving at 3 and 6), against 1..3 then a resume to 6.
TEST_P(ResumeTest, ContinuesTheSameLossCurveAndWritesTheSameCheckpoint) {
  const fs::path dir = test_dir();
  const std::string strategy = GetParam();
  const json straight =
      run_ok(dir, job(strategy, 6) + std::vector<std::string>{"--save", (dir / "a").string(), "--save-every", "3"},
             "straight.json");
  ASSERT_FALSE(straight.is_null());
  ASSERT_EQ(straight["run"]["checkpoints"].size(), 2u);
  ASSERT_TRUE(fs::exists(dir / "a" / "step-000003" / "manifest.json"));

  const json resumed = run_ok(dir,
                              job(strategy, 6) + std::vector<std::string>{"--resume", (dir / "a" / "step-000003").string(),
                                                                          "--save", (dir / "b").string()},
                              "resumed.json");
  ASSERT_FALSE(resumed.is_null());
  EXPECT_EQ(resumed["run"]["first_step"], 4);
  const std::vector<double> all = losses(straight), tail = losses(resumed);
  ASSERT_EQ(all.size(), 6u);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tail[i], all[3 + i]) << "step " << 4 + i << " of " << strategy;
  for (double l : all) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;

  // The state at step 6 is the same bytes whichever way it got there.
  const auto want = checkpoint_files(dir / "a" / "step-000006");
  const auto got = checkpoint_files(dir / "b" / "step-000006");
  ASSERT_EQ(want.size(), 3u);  // two rank files and the manifest
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs between the straight and the resumed run";
  }
  // A resumed run's memory is the steady state the planner predicts.
  for (const auto& rank : resumed["ranks"]) EXPECT_NEAR(rank["peak_error_pct"].get<double>(), 0.0, 1e-9);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ResumeTest,
                         ::testing::Values("ddp/fp32/wrap=none", "zero1/fp32/wrap=none", "zero2/fp32/wrap=block",
                                           "zero3+offload/fp32/wrap=block", "zero3+ckpt/bf16/wrap=block",
                                           "hybrid/fp32/wrap=block"));

// A rank dies as step 5 begins; the checkpoint of step 4 was committed.
TEST(RunCheckpoint, AKilledRankLosesNothingCommitted) {
  const fs::path dir = test_dir();
  const std::string strategy = "zero3/fp32/wrap=block";
  const json straight = run_ok(dir, job(strategy, 6), "straight.json");
  ASSERT_FALSE(straight.is_null());

  const Result killed = shardfit(
      dir, job(strategy, 6) + std::vector<std::string>{"--save", (dir / "c").string(), "--save-every", "2"},
      "SHARDFIT_TEST_DIE_AT_STEP=5");
  EXPECT_EQ(killed.exit_code, 3) << killed.err;
  EXPECT_TRUE(fs::exists(dir / "c" / "step-000004" / "manifest.json"));
  EXPECT_FALSE(fs::exists(dir / "c" / "step-000006"));

  // --resume on the root takes its latest committed step.
  const json resumed =
      run_ok(dir, job(strategy, 6) + std::vector<std::string>{"--resume", (dir / "c").string()}, "resumed.json");
  ASSERT_FALSE(resumed.is_null());
  EXPECT_EQ(resumed["run"]["first_step"], 5);
  EXPECT_NE(resumed["run"]["resumed_from"].get<std::string>().find("step-000004"), std::string::npos);
  const std::vector<double> all = losses(straight), tail = losses(resumed);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], all[4]);
  EXPECT_EQ(tail[1], all[5]);
  fs::remove_all(dir);
}

// The export: Hugging Face names and shapes, no padding, the tied lm_head
// stored once (as HF's GPT-2 checkpoints do), and the same model from a
// sharded job as from a replicated one.
TEST(RunCheckpoint, ExportIsOneHuggingFaceSafetensorsFile) {
  const fs::path dir = test_dir();
  const fs::path z3 = dir / "zero3.safetensors", dd = dir / "ddp.safetensors";
  const json a = run_ok(dir,
                        job("zero3/fp32/wrap=block", 3) +
                            std::vector<std::string>{"--save", (dir / "z").string(), "--export", z3.string()},
                        "z.json");
  const json b = run_ok(
      dir, job("ddp/fp32/wrap=none", 3) + std::vector<std::string>{"--save", (dir / "d").string(), "--export", dd.string()},
      "d.json");
  ASSERT_FALSE(a.is_null());
  ASSERT_FALSE(b.is_null());
  const auto sharded = read_safetensors(z3), replicated = read_safetensors(dd);
  int64_t elements = 0;
  for (const auto& [name, t] : sharded) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    elements += n;
    EXPECT_EQ(t.dtype, "F32") << name;
  }
  EXPECT_EQ(elements, a["model"]["params"].get<int64_t>()) << "every parameter once, no padding";
  ASSERT_TRUE(sharded.count("transformer.wte.weight"));
  ASSERT_TRUE(sharded.count("transformer.h.0.attn.c_attn.weight"));
  ASSERT_TRUE(sharded.count("transformer.ln_f.bias"));
  EXPECT_FALSE(sharded.count("lm_head.weight")) << "tied to transformer.wte.weight";
  const auto& c_attn = sharded.at("transformer.h.0.attn.c_attn.weight").shape;
  ASSERT_EQ(c_attn.size(), 2u);
  EXPECT_EQ(c_attn[1], 3 * c_attn[0]) << "Conv1D weights are [in, out] as in Hugging Face GPT-2";

  // Same data, same steps: the sharded and the replicated job end at the
  // same weights up to reduction order.
  ASSERT_EQ(sharded.size(), replicated.size());
  double worst = 0;
  for (const auto& [name, t] : sharded) {
    ASSERT_TRUE(replicated.count(name)) << name;
    const auto& r = replicated.at(name);
    ASSERT_EQ(t.shape, r.shape) << name;
    for (size_t i = 0; i < t.values.size(); ++i)
      worst = std::max(worst, std::abs(double(t.values[i]) - r.values[i]) / (std::abs(double(r.values[i])) + 1e-3));
  }
  EXPECT_LT(worst, 1e-4);
  fs::remove_all(dir);
}

TEST(RunCheckpoint, BadCheckpointOptionsAreExitTwoWithOneLine) {
  const fs::path dir = test_dir();
  const std::string ckpt = (dir / "k").string();
  ASSERT_FALSE(run_ok(dir, job("zero2/fp32/wrap=block", 2) + std::vector<std::string>{"--save", ckpt}, "r.json")
                   .is_null());
  expect_bad_input(dir, job("zero2/fp32/wrap=block", 2) + std::vector<std::string>{"--resume", ckpt}, "--resume");
  expect_bad_input(dir,
                   {"run", "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block", "--nproc", "3", "--oversubscribe", "--steps",
                    "4", "--resume", ckpt},
                   "3");
  expect_bad_input(dir, job("zero2/fp32/wrap=block", 4) + std::vector<std::string>{"--resume", (dir / "nope").string()},
                   "nope");
  expect_bad_input(dir, job("zero2/fp32/wrap=block", 4) + std::vector<std::string>{"--export", "x.safetensors"},
                   "--export");
  expect_bad_input(dir, {"run", "--model", "gpt2-tiny", "--backend", "loopback", "--world-size", "2", "--save", ckpt},
                   "loopback");
  // A checkpoint of another wrap policy has other shards.
  expect_bad_input(dir, job("zero2/fp32/wrap=none", 4) + std::vector<std::string>{"--resume", ckpt}, ckpt);
  fs::remove_all(dir);
}

}  // namespace
