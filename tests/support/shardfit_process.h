// The shardfit binary as a user or a script runs it, for every test that
// drives it as a subprocess: one place for the per-test directory, the
// runner (exit code, stdout, stderr) and SPEC's bad-input check. Header-only,
// no LibTorch. A test target defines SHARDFIT_BINARY (the built executable).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"

#ifndef SHARDFIT_BINARY
#error "SHARDFIT_BINARY must be the path of the built shardfit executable"
#endif

namespace shardfit::test_support {

namespace fs = std::filesystem;

// "Suite_Name_PID": unique per test and per test process (ctest runs tests
// of one binary in parallel processes).
// Parameterised tests' names ("Strategies/ResumeTest", ".../0") carry
// slashes: they become underscores, so the id is one path component.
inline std::string test_id() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string id = std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid());
  for (char& c : id)
    if (c == '/') c = '_';
  return id;
}

// A fresh, empty directory for the running test, in the process's
// scratch folder: <prefix>_<id>.
inline fs::path test_dir(const std::string& prefix = "test") {
  fs::path d = scratch_root() / (prefix + "_" + test_id());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A path (not created) for the running test, in the process's scratch
// folder: cli_<id>_<stem>.
inline std::string temp_path(const std::string& stem) {
  return (scratch_root() / ("cli_" + test_id() + "_" + stem)).string();
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int exit_code = -1;  // 128 + N when killed by signal N
  std::string out, err;
  double seconds = 0;  // wall time of the run
};

// Runs `ENV [timeout] shardfit ARGS` (each argument single-quoted) with no
// stdin. `env` is a prefix such as "SLURM_PROCID=0"; `timeout_s` > 0 ends a
// hung job (and what it started) with timeout(1): exit 124 or 137.
inline Result shardfit(const std::vector<std::string>& args, const std::string& env = "", int timeout_s = 0) {
  static std::atomic<int> calls{0};  // concurrent calls (ranks) need their own files
  const std::string n = std::to_string(calls++);
  const std::string out = temp_path("stdout" + n), err = temp_path("stderr" + n);
  std::string cmd = env + (env.empty() ? "" : " ");
  if (timeout_s > 0) cmd += "timeout -k 5 " + std::to_string(timeout_s) + " ";
  cmd += "'" SHARDFIT_BINARY "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " </dev/null >'" + out + "' 2>'" + err + "'";
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

inline std::string joined(const std::vector<std::string>& args) {
  std::string shown;
  for (const auto& a : args) shown += a + " ";
  return shown;
}

// SPEC: exit 2 and one line on stderr that names the input. Returns the run.
inline Result expect_bad_input(const std::vector<std::string>& args, const std::string& names,
                               const std::string& env = "", int timeout_s = 0) {
  const std::string shown = joined(args);
  const Result r = shardfit(args, env, timeout_s);
  EXPECT_EQ(r.exit_code, 2) << shown << "\nstderr: " << r.err;
  EXPECT_FALSE(r.err.empty()) << shown;
  if (r.err.empty()) return r;
  EXPECT_EQ(r.err.back(), '\n') << shown;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << shown << ": more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(names), std::string::npos) << shown << ": does not name '" << names << "': " << r.err;
  return r;
}

}  // namespace shardfit::test_support
