// Runs the shardfit binary as a user or a script does: a subprocess whose
// exit code, stdout and stderr the tests check against SPEC's contract. No
// LibTorch, so these tests compile in seconds.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef SHARDFIT_BINARY
#error "SHARDFIT_BINARY must be the path of the built shardfit executable"
#endif

namespace shardfit::cli_test {

// A per-test, per-process temporary path.
inline std::string temp_path(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::temp_directory_path() /
          (std::string("shardfit_cli_") + info->test_suite_name() + "_" + info->name() + "_" +
           std::to_string(::getpid()) + "_" + stem))
      .string();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int exit_code = -1;
  std::string out, err;
};

// Runs `ENV shardfit ARGS` (each argument single-quoted) with no stdin;
// `env` is a prefix such as "SLURM_PROCID=0 ".
inline Result shardfit(const std::vector<std::string>& args, const std::string& env = "") {
  static std::atomic<int> calls{0};  // concurrent calls (ranks) need their own files
  const std::string n = std::to_string(calls++);
  const std::string out = temp_path("stdout" + n), err = temp_path("stderr" + n);
  std::string cmd = env + "'" SHARDFIT_BINARY "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " </dev/null >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  Result r;
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

// SPEC: exit 2, one line on stderr that names the input.
inline void expect_bad_input(const std::vector<std::string>& args, const std::string& names,
                             const std::string& env = "") {
  const std::string shown = joined(args);
  const Result r = shardfit(args, env);
  EXPECT_EQ(r.exit_code, 2) << shown << "\nstderr: " << r.err;
  ASSERT_FALSE(r.err.empty()) << shown;
  EXPECT_EQ(r.err.back(), '\n') << shown;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << shown << ": more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(names), std::string::npos)
      << shown << ": does not name '" << names << "': " << r.err;
}

}  // namespace shardfit::cli_test
