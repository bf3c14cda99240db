// The failures a command ends with, each mapped to one of SPEC's exit codes
// (spec/exit_codes.h) by the CLI's main: defined here, below every layer,
// so that the layer that runs jobs (launch/) throws the same ones the CLI
// catches.
#pragma once

#include <stdexcept>
#include <string>

namespace shardfit::spec {

// Bad input found after parsing: one line naming the input (exit 2).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A rank died, a rendezvous timed out, a collective failed (exit 3).
struct EnvironmentFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// SIGTERM/SIGINT stopped the job: main prints the one line and
// exits 128 + signal (130 SIGINT, 143 SIGTERM).
struct Interrupted : std::runtime_error {
  Interrupted(const std::string& what, int sig) : std::runtime_error(what), signal(sig) {}
  int signal;
};

}  // namespace shardfit::spec
