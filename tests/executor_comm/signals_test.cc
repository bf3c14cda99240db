// Issue 14, signals and process hygiene: SIGTERM/SIGINT to `run`'s
// launcher or to `validate` stops every process of the job within 5 s,
// writes the report so far ("interrupted": true), and exits 143/130 with
// one line; ranks whose MASTER_PORT is held by a process that never answers
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
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef SHARDFIT_BINARY
#error "SHARDFIT_BINARY must be the path of the built shardfit executable"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = fs::temp_directory_path() / (std::string("shardfit_signals_") + info->name() +
                                                  "_" + std::to_string(::getpid()));
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
