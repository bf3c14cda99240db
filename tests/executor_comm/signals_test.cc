// Signals and process hygiene: SIGTERM/SIGINT to `run`'s
// launcher or to `validate` stops every process of the job within 5 s,
// writes the report so far ("interrupted": true), and exits 143/130 with
// one line; with `run --save-on-signal` every rank first finishes its step
// and saves it (resumable bit for bit), and a second signal stops at once; ranks whose MASTER_PORT is held by a process that never answers
// end within --timeout + 5 s. Each job runs in its own process group; the
// test asserts that no process of that group is left behind. Every wait is
// bounded.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/scratch_dir.h"

#ifndef SHARDFIT_BINARY
#error "SHARDFIT_BINARY must be the path of the built shardfit executable"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = shardfit::test_support::scratch_root() / (std::string("signals_") + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The shardfit binary in a process group of its own (pgid = its pid), or
// in group `pgid` when given; `env`: extra NAME=VALUE entries.
pid_t start_job(const std::vector<std::string>& args, const fs::path& dir, pid_t pgid = 0,
                const std::vector<std::string>& env = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, pgid);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    FILE* out = std::freopen((dir / "stdout").c_str(), "w", stdout);
    FILE* err = std::freopen((dir / "stderr").c_str(), "w", stderr);
    (void)out;
    (void)err;
    std::vector<char*> argv = {const_cast<char*>(SHARDFIT_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(SHARDFIT_BINARY, argv.data());
    _exit(127);
  }
  setpgid(pid, pgid == 0 ? pid : pgid);  // either side may win the race; both set the same group
  return pid;
}

// Waits (bounded) until `needle` appears in the job's output files.
bool wait_for_output(const fs::path& dir, const std::string& needle, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if ((read_file(dir / "stdout") + read_file(dir / "stderr")).find(needle) != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The exit status of `pid`, waiting at most `seconds`; -1 if it is still running.
int wait_exit(pid_t pid, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// No process of group `pgid` is left (zombies of other parents aside, the
// ranks' parent is gone, so init reaps them): waits up to `seconds`, then
// kills whatever is left so no test leaks processes, and fails.
void expect_no_process_left(pid_t pgid, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (kill(-pgid, 0) != 0 && errno == ESRCH) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-pgid, SIGKILL);
  ADD_FAILURE() << "processes of group " << pgid << " were left behind";
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class RunSignal : public ::testing::TestWithParam<int> {};

TEST_P(RunSignal, StopsEveryRankWithinFiveSecondsWritesTheReportAndExits128PlusSignal) {
  const int sig = GetParam();
  const fs::path dir = test_dir();
  const fs::path report = dir / "r.json";
  const pid_t pid = start_job(
      {"run", "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block", "--nproc", "2",
       "--seq-len", "16", "--steps", "100000", "--timeout", "60", "--out", report.string()},
      dir);
  ASSERT_TRUE(wait_for_output(dir, "step 1/", 90)) << read_file(dir / "stderr");
  const auto sent = Clock::now();
  kill(pid, sig);  // the launcher only, as `kill PID` does
  const int code = wait_exit(pid, 10);
  const double took = std::chrono::duration<double>(Clock::now() - sent).count();
  if (code < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
  EXPECT_EQ(code, 128 + sig);
  EXPECT_LT(took, 5.0);
  expect_no_process_left(pid, 5);
  // The launcher's last words: one line on stderr after the ranks' output.
  const std::string err = read_file(dir / "stderr");
  const std::string last = err.substr(err.rfind('\n', err.size() - 2) + 1);
  EXPECT_NE(last.find(sig == SIGTERM ? "interrupted by SIGTERM" : "interrupted by SIGINT"),
            std::string::npos)
      << err;
  EXPECT_EQ(lines(last), 1u);
  ASSERT_TRUE(fs::exists(report));
  const auto j = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(j["run"]["interrupted"], true);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, RunSignal, ::testing::Values(SIGTERM, SIGINT));

// --- run --save-on-signal --------------------------------------------------

// The shardfit binary run to its end (bounded: killed after `seconds`).
int run_to_end(const std::vector<std::string>& args, const fs::path& dir, double seconds = 120) {
  const pid_t pid = start_job(args, dir);
  const int code = wait_exit(pid, seconds);
  if (code < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
  return code;
}

// The processes whose parent is `parent` (the launcher's ranks), from /proc.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string stat = read_file(e.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 2));
    char state = 0;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::atoi(e.path().filename().c_str())));
  }
  return out;
}

std::string last_line(const std::string& s) {
  return s.substr(s.rfind('\n', s.size() >= 2 ? s.size() - 2 : 0) + 1);
}

// gpt2-tiny on two gloo ranks, dropout on: the saved generator state matters.
std::vector<std::string> tiny_job(int64_t steps, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"run",       "--model", "gpt2-tiny", "--strategy", "zero2/fp32/wrap=block",
                                   "--nproc",   "2",       "--batch",   "2",          "--seq-len",
                                   "32",        "--steps", std::to_string(steps),    "--timeout", "60"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::vector<double> report_losses(const fs::path& report) {
  return nlohmann::json::parse(read_file(report))["run"]["loss"].get<std::vector<double>>();
}

// Where the stop signal goes: the launcher only (`kill PID`), one rank only
// (a signal the launcher never sees), or the whole process group (Ctrl-C).
enum class SignalTarget { kLauncher, kOneRank, kGroup };

class SaveOnSignal : public ::testing::TestWithParam<std::pair<SignalTarget, int>> {};

TEST_P(SaveOnSignal, EveryRankFinishesItsStepSavesItAndResumeContinuesTheSameLosses) {
  const auto [target, sig] = GetParam();
  const fs::path dir = test_dir();
  const fs::path ckpt = dir / "ckpt", report = dir / "r.json";
  const pid_t pid = start_job(
      tiny_job(100000, {"--save", ckpt.string(), "--save-on-signal", "--out", report.string()}), dir);
  ASSERT_TRUE(wait_for_output(dir, "step 1/", 90)) << read_file(dir / "stderr");
  if (target == SignalTarget::kLauncher) {
    kill(pid, sig);
  } else if (target == SignalTarget::kGroup) {
    kill(-pid, sig);
  } else {
    const std::vector<pid_t> ranks = children_of(pid);
    ASSERT_EQ(ranks.size(), 2u);
    kill(ranks.back(), sig);
  }
  // The step in progress and a save of gpt2-tiny: well under a second each.
  const int code = wait_exit(pid, 30);
  if (code < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
  EXPECT_EQ(code, 128 + sig) << read_file(dir / "stderr");
  expect_no_process_left(pid, 5);

  // One line: the signal, the step, where it went.
  const std::string err = read_file(dir / "stderr");
  const std::string last = last_line(err);
  EXPECT_EQ(lines(last), 1u);
  EXPECT_NE(last.find("interrupted by " + std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT")), std::string::npos)
      << err;
  EXPECT_NE(last.find("saved it to " + ckpt.string() + "/step-"), std::string::npos) << err;

  // The report: interrupted, the step saved, a committed checkpoint of it.
  ASSERT_TRUE(fs::exists(report));
  const auto j = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(j["run"]["interrupted"], true);
  ASSERT_TRUE(j["run"]["saved_on_signal_step"].is_number_integer()) << j["run"].dump();
  const int64_t k = j["run"]["saved_on_signal_step"].get<int64_t>();
  EXPECT_GE(k, 1);
  EXPECT_EQ(j["run"]["loss"].size(), static_cast<size_t>(k));
  ASSERT_FALSE(j["run"]["checkpoints"].empty());
  const std::string saved = j["run"]["checkpoints"].back().get<std::string>();
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(k));
  EXPECT_EQ(fs::path(saved).filename().string(), name);
  EXPECT_NE(last.find(saved), std::string::npos) << err;
  fs::create_directories(dir / "verify");
  EXPECT_EQ(run_to_end({"verify", saved}, dir / "verify"), 0) << read_file(dir / "verify" / "stderr");

  if (target != SignalTarget::kLauncher) {
    fs::remove_all(dir);
    return;
  }
  // Resuming continues bit for bit: steps k+1, k+2 as a run that never stopped.
  fs::create_directories(dir / "resume");
  fs::create_directories(dir / "straight");
  const fs::path resumed = dir / "resumed.json", straight = dir / "straight.json";
  ASSERT_EQ(run_to_end(tiny_job(k + 2, {"--resume", ckpt.string(), "--out", resumed.string()}), dir / "resume"), 0)
      << read_file(dir / "resume" / "stderr");
  ASSERT_EQ(run_to_end(tiny_job(k + 2, {"--out", straight.string()}), dir / "straight"), 0)
      << read_file(dir / "straight" / "stderr");
  const std::vector<double> interrupted = j["run"]["loss"].get<std::vector<double>>();
  const std::vector<double> tail = report_losses(resumed), all = report_losses(straight);
  ASSERT_EQ(all.size(), static_cast<size_t>(k + 2));
  ASSERT_EQ(tail.size(), 2u);
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(interrupted[i], all[i]) << "step " << i + 1;
  EXPECT_EQ(tail[0], all[k]) << "step " << k + 1;
  EXPECT_EQ(tail[1], all[k + 1]) << "step " << k + 2;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, SaveOnSignal,
                         ::testing::Values(std::make_pair(SignalTarget::kLauncher, SIGTERM),
                                           std::make_pair(SignalTarget::kOneRank, SIGTERM),
                                           std::make_pair(SignalTarget::kGroup, SIGINT)));

// A second signal while the ranks save: they are killed at once, the save
// in progress is never committed, and the checkpoint committed before it
// (--save-every) stays intact. SHARDFIT_TEST_SLOW_SAVE_S holds every save
// between the rank files and the commit, so the test can signal inside one.
TEST(SaveOnSignalTwice, ASecondSignalWhileSavingStopsAtOnceAndKeepsTheLastCommittedStep) {
  const fs::path dir = test_dir();
  const fs::path ckpt = dir / "ckpt", report = dir / "r.json";
  const pid_t pid = start_job(tiny_job(100000, {"--save", ckpt.string(), "--save-every", "2", "--save-on-signal",
                                                "--out", report.string()}),
                              dir, 0, {"SHARDFIT_TEST_SLOW_SAVE_S=3"});
  ASSERT_TRUE(wait_for_output(dir, "step 2: checkpoint", 90)) << read_file(dir / "stderr");
  kill(pid, SIGTERM);
  // The ranks agree on the signal at the end of some step (which one depends
  // on when it reaches them: under load, a few steps later) and announce the
  // save of that step; the second signal goes in while that save holds
  // before its commit (3 s).
  ASSERT_TRUE(wait_for_output(dir, "stopping on signal", 30)) << read_file(dir / "stderr");
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {  // the signal save's announcement, after the stop line
    const std::string all = read_file(dir / "stderr");
    const size_t stop_at = all.find("stopping on signal");
    if (stop_at != std::string::npos && all.find("before the commit", stop_at) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto sent = Clock::now();
  kill(pid, SIGTERM);
  const int code = wait_exit(pid, 10);
  const double took = std::chrono::duration<double>(Clock::now() - sent).count();
  if (code < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
  EXPECT_EQ(code, 143) << read_file(dir / "stderr");
  EXPECT_LT(took, 2.0) << "a second signal stops at once, not after the save";
  expect_no_process_left(pid, 5);
  const std::string err = read_file(dir / "stderr");
  EXPECT_NE(last_line(err).find("second signal"), std::string::npos) << err;
  EXPECT_EQ(lines(last_line(err)), 1u);
  // The save that was cut short (the step rank 0 announced stopping at): no
  // manifest. Every save committed before it (step 2, and under load a
  // regular save or two more, --save-every 2, before the first signal got
  // through): whole, as verify checks.
  const size_t stop_at = err.rfind("stopping on signal");
  ASSERT_NE(stop_at, std::string::npos) << err;
  const size_t line_at = err.rfind('\n', stop_at) == std::string::npos ? 0 : err.rfind('\n', stop_at) + 1;
  const std::string stop_line = err.substr(line_at, stop_at - line_at);  // "[...] step N: "
  const size_t step_at = stop_line.rfind("step ");
  ASSERT_NE(step_at, std::string::npos) << stop_line;
  const long signal_step = std::strtol(stop_line.c_str() + step_at + 5, nullptr, 10);
  ASSERT_GT(signal_step, 2) << err;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06ld", signal_step);
  EXPECT_TRUE(fs::exists(ckpt / name)) << "the signal save left no directory: " << name;
  EXPECT_FALSE(fs::exists(ckpt / name / "manifest.json")) << name;
  int committed = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (!fs::exists(e.path() / "manifest.json")) continue;
    ++committed;
    const fs::path v = dir / ("verify-" + e.path().filename().string());
    fs::create_directories(v);
    EXPECT_EQ(run_to_end({"verify", e.path().string()}, v), 0) << read_file(v / "stderr");
  }
  EXPECT_GE(committed, 1);
  EXPECT_TRUE(fs::exists(ckpt / "step-000002" / "manifest.json"));
  const auto j = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(j["run"]["interrupted"], true);
  EXPECT_TRUE(j["run"]["saved_on_signal_step"].is_null());
  fs::remove_all(dir);
}

// torchrun- or Slurm-started ranks (no launcher of ours): a SIGTERM that
// reaches rank 1 only stops both after the same step; rank 0 says so in
// one line, rank 1 says nothing, both exit 143.
TEST(SaveOnSignalRanks, ASignalToOneTorchrunRankStopsBothAfterTheSameStep) {
  const fs::path dir = test_dir();
  const int probe = socket(AF_INET, SOCK_STREAM, 0);  // a free port for the store
  ASSERT_GE(probe, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
  close(probe);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const fs::path ckpt = dir / "ckpt", report = dir / "r.json";
  const std::vector<std::string> args = {
      "run",       "--model", "gpt2-tiny", "--strategy", "zero3/fp32/wrap=block", "--batch",  "2",
      "--seq-len", "32",      "--steps",   "100000",     "--timeout",             "60",       "--save",
      ckpt.string(), "--save-on-signal", "--out", report.string()};
  pid_t ranks[2];
  for (int r = 0; r < 2; ++r) {
    fs::create_directories(dir / std::to_string(r));
    ranks[r] = start_job(args, dir / std::to_string(r), r == 0 ? 0 : ranks[0],
                         {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r),
                          "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "OMP_NUM_THREADS=1"});
  }
  ASSERT_TRUE(wait_for_output(dir / "0", "step 1/", 90)) << read_file(dir / "0" / "stderr");
  kill(ranks[1], SIGTERM);
  for (int r = 0; r < 2; ++r) {
    const int code = wait_exit(ranks[r], 30);
    if (code < 0) kill(-ranks[0], SIGKILL), waitpid(ranks[r], nullptr, 0);
    EXPECT_EQ(code, 143) << "rank " << r << ": " << read_file(dir / std::to_string(r) / "stderr");
  }
  expect_no_process_left(ranks[0], 5);
  const std::string err0 = read_file(dir / "0" / "stderr");
  EXPECT_EQ(lines(last_line(err0)), 1u);
  EXPECT_NE(last_line(err0).find("interrupted by SIGTERM: all 2 rank(s) finished step"), std::string::npos) << err0;
  EXPECT_EQ(read_file(dir / "1" / "stderr"), "");
  const auto j = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(j["run"]["interrupted"], true);
  ASSERT_TRUE(j["run"]["saved_on_signal_step"].is_number_integer());
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld",
                static_cast<long long>(j["run"]["saved_on_signal_step"].get<int64_t>()));
  EXPECT_TRUE(fs::exists(ckpt / name / "manifest.json"));
  fs::remove_all(dir);
}

TEST(SaveOnSignalBadInput, WithoutSaveIsExitTwoWithOneLineNamingIt) {
  const fs::path dir = test_dir();
  for (const auto& args : {std::vector<std::string>{"run", "--model", "gpt2-tiny", "--save-on-signal"},
                           tiny_job(4, {"--save-on-signal"}),
                           tiny_job(4, {"--save-on-signal", "--resume", (dir / "none").string()})}) {
    EXPECT_EQ(run_to_end(args, dir, 60), 2);
    const std::string err = read_file(dir / "stderr");
    EXPECT_EQ(lines(err), 1u) << err;
    EXPECT_NE(err.find("--save-on-signal"), std::string::npos) << err;
    EXPECT_NE(err.find("--save DIR"), std::string::npos) << err;
  }
  fs::remove_all(dir);
}

TEST(ValidateSignal, SigtermStopsTheRunChildAndItsRanksLeavingNoProcess) {
  const fs::path dir = test_dir();
  const std::string plan = (dir / "plan.json").string();
  const std::string plan_cmd =
      "timeout 60 '" SHARDFIT_BINARY
      "' plan --model gpt2-tiny --device cpu --gpu-mem 64MiB --seq-len 32 --gpus 2 "
      "--strategies zero2/fp32/wrap=block --out '" +
      plan + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(plan_cmd.c_str()), 0);
  const pid_t pid = start_job(
      {"validate", "--plan", plan, "--steps", "100000", "--out-dir", (dir / "v").string()}, dir);
  // The run child writes its log under the out dir; wait for its first step.
  const auto end = Clock::now() + std::chrono::seconds(90);
  bool started = false;
  while (!started && Clock::now() < end) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / "v", ec))
      if (read_file(e.path()).find("step 1/") != std::string::npos) started = true;
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(started);
  kill(pid, SIGTERM);
  const int code = wait_exit(pid, 10);
  if (code < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
  EXPECT_EQ(code, 143) << read_file(dir / "stderr");
  expect_no_process_left(pid, 5);
  const std::string err = read_file(dir / "stderr");
  // stderr also carries validate's progress log lines ("[date] [shardfit]
  // [info] validate 1/2 ..."); the interruption itself is one line.
  size_t messages = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) messages += !line.empty() && line[0] != '[';
  EXPECT_EQ(messages, 1u) << err;
  EXPECT_NE(err.find("interrupted by SIGTERM"), std::string::npos) << err;
  fs::remove_all(dir);
}

// A busy MASTER_PORT: something listens there and never answers. Rank 0
// cannot host the store (exit 3 at once); rank 1 connects to the squatter
// and would wait in the handshake for ever: the watchdog ends it.
TEST(BoundedWaits, BusyMasterPortEndsEveryRankWithinTimeoutPlusFiveSeconds) {
  const fs::path dir = test_dir();
  const int squatter = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(squatter, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(squatter, 16), 0);
  socklen_t len = sizeof addr;
  getsockname(squatter, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const std::vector<std::string> args = {"run",     "--model", "gpt2-tiny", "--seq-len", "16",
                                         "--steps", "2",       "--timeout", "3"};
  const auto start = Clock::now();
  pid_t ranks[2];
  for (int r = 0; r < 2; ++r) {
    fs::create_directories(dir / std::to_string(r));
    ranks[r] =
        start_job(args, dir / std::to_string(r), r == 0 ? 0 : ranks[0],
                  {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r),
                   "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port});
  }
  for (int r = 0; r < 2; ++r) {
    const int code = wait_exit(ranks[r], 40);
    if (code < 0) kill(-ranks[0], SIGKILL), waitpid(ranks[r], nullptr, 0);
    EXPECT_EQ(code, 3) << "rank " << r << ": " << read_file(dir / std::to_string(r) / "stderr");
  }
  // 3 s of --timeout + 5 s of watchdog grace, plus loading LibTorch twice on a busy machine.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3 + 5 + 15.0);
  expect_no_process_left(ranks[0], 5);
  close(squatter);
  fs::remove_all(dir);
}

}  // namespace
