// One child process run to completion, its output kept in a log file: how
// `validate` runs each candidate's `shardfit run` (launch/validate.h) and how
// `plan` runs the Python tracer for a model with no built-in
// (launch/hf_trace_route.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shardfit::launch {

struct ChildExit {
  // The exit status (128 + signal when a signal ended it; 127 when it could
  // not start).
  int status = 0;
  // Nonzero when this process was asked to stop (SIGTERM/SIGINT, caught by
  // executor's stop handlers) while the child ran: the signal. The child
  // was passed SIGTERM, given 5 s to stop its own children, then killed.
  int stop_signal = 0;
};

// Runs `argv` (argv[0] looked up on PATH when it has no slash) with its
// stdout and stderr into `log`, and `env` set in the child where the
// environment does not already set it. The child dies with this process
// (PR_SET_PDEATHSIG: SIGTERM). Throws spec::EnvironmentFailure when fork or
// waitpid fails.
// This executable's path (/proc/self/exe), for spawning itself.
std::string self_exe();

ChildExit run_child(const std::vector<std::string>& argv, const std::string& log,
                    const std::vector<std::pair<std::string, std::string>>& env = {});

// A child's last words: the last line of its `log` with more than blanks
// on it ("" when there is none).
std::string last_line(const std::string& log);

}  // namespace shardfit::launch
