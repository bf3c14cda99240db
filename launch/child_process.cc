#include "launch/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "executor/signals.h"
#include "spec/errors.h"

namespace shardfit::launch {
namespace {

int exit_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// SIGTERM, 5 s for the child to stop its own children (a `run` launcher its
// ranks), then SIGKILL; returns its wait status.
int stop_child(pid_t pid) {
  int status = 0;
  kill(pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    usleep(50 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return status;
}

}  // namespace

ChildExit run_child(const std::vector<std::string>& argv, const std::string& log,
                    const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw spec::EnvironmentFailure(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(125);
    if (FILE* f = std::fopen(log.c_str(), "w")) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw spec::EnvironmentFailure(std::string("waitpid failed: ") + std::strerror(errno));
    if (const int sig = executor::stop_signal_received()) return {exit_status(stop_child(pid)), sig};
  }
  return {exit_status(status), 0};
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string("shardfit");
}

std::string last_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

}  // namespace shardfit::launch
