// `shardfit run`'s honest report: an out-of-memory run exits 4 (the report
// written anyway) unless --oom-ok; `--steps 1` is predicted for the one
// step it runs; the recorded command re-runs the same job.
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  const std::string text = read_file(path);
  std::remove(path.c_str());
  return text.empty() ? json() : json::parse(text);
}

TEST(RunExit, OutOfMemoryIsExitFourWithTheReportWritten) {
  const std::string out = temp_path("oom.json");
  const std::vector<std::string> args = {"run",    "--model", "gpt2-tiny", "--seq-len",
                                         "16",     "--steps", "1",         "--gpu-mem",
                                         "200KiB", "--out",   out};
  Result r = shardfit(args);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("out of memory on rank(s) 0"), std::string::npos) << r.err;
  const json rep = read_json(out);
  ASSERT_FALSE(rep.is_null());
  EXPECT_TRUE(rep["ranks"][0]["oom"].get<bool>());
  std::vector<std::string> ok = args;
  ok.push_back("--oom-ok");
  r = shardfit(ok);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::remove(out.c_str());
  const Result help = shardfit({"run", "--help"});
  EXPECT_NE(help.out.find("--oom-ok"), std::string::npos);
}

TEST(RunReport, OneStepIsPredictedForTheOneStepItRuns) {
  const std::string out = temp_path("one.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--seq-len", "32", "--batch", "2",
                             "--steps", "1", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rep = read_json(out);
  const json& rank = rep["ranks"][0];
  for (const auto& s : rank["predicted"]["timeline"])
    EXPECT_EQ(s["phase"].get<std::string>().rfind("step2/", 0), std::string::npos) << s["phase"];
  EXPECT_EQ(rank["predicted"]["peak_allocated_bytes"], rank["measured"]["peak_allocated_bytes"]);
  EXPECT_EQ(rank["peak_error_pct"].get<double>(), 0.0);
}

TEST(RunReport, TheRecordedCommandReRunsTheSameJob) {
  const std::string out = temp_path("ranks.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block",
                             "--nproc", "2", "--seq-len", "16", "--steps", "1", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rep = read_json(out);
  const std::string command = rep["command"];
  EXPECT_NE(command.find("--nproc 2"), std::string::npos) << command;
  ASSERT_EQ(command.rfind("shardfit run ", 0), 0u) << command;
  // Run it as recorded (its words, after "shardfit").
  std::vector<std::string> words;
  std::istringstream in(command.substr(9));
  for (std::string w; in >> w;) words.push_back(w);
  const Result again = shardfit(words);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const json rep2 = read_json(out);
  EXPECT_EQ(rep2["run"]["world_size"], 2);
  EXPECT_EQ(rep2["candidate"], "zero2/fp32/wrap=block");
  EXPECT_EQ(rep2["command"], command);
  EXPECT_EQ(rep2["run"]["loss"], rep["run"]["loss"]);
}

// The report says how long a step took and what the time model
// predicted for it, on the report's profile (cpu here). The error's size is
// the time model's accuracy on this machine, not checked here (a speed on a
// shared VM gates nothing); its arithmetic and presence are.
TEST(RunReport, CarriesTheStepTimeMeasuredAndPredicted) {
  const std::string out = temp_path("time.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block", "--nproc", "2",
                             "--seq-len", "16", "--batch", "2", "--steps", "3", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted"), std::string::npos) << r.out;
  const Result cmp = shardfit({"compare", out});
  EXPECT_NE(cmp.out.find("step time"), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("not gated"), std::string::npos) << cmp.out;
  const json rep = read_json(out);  // and removes it
  const json& run = rep["run"];
  const double measured = run["step_time_s"]["measured"].get<double>();
  const double predicted = run["step_time_s"]["predicted"].get<double>();
  EXPECT_GT(predicted, 0);
  // 2 ranks x batch 2 x seq 16 = 64 tokens a step.
  EXPECT_NEAR(measured, 64.0 / run["tokens_per_s"].get<double>(), 1e-12 * measured);
  EXPECT_NEAR(run["step_time_error_pct"].get<double>(), 100.0 * (predicted - measured) / measured, 1e-9);
}

TEST(RunReport, ALoopbackRunHasNoStepTime) {
  const std::string out = temp_path("loop.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block", "--backend",
                             "loopback", "--world-size", "2", "--seq-len", "16", "--steps", "2", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rep = read_json(out);
  EXPECT_TRUE(rep["run"]["step_time_error_pct"].is_null()) << rep["run"].dump();
  EXPECT_TRUE(rep["run"]["step_time_s"]["measured"].is_null()) << rep["run"].dump();
}

}  // namespace
}  // namespace shardfit::cli_test
