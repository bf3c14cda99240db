// SIGTERM / SIGINT for processes that own children (`run`'s launcher,
// `validate`): the handler only records the signal; the owner's wait loop
// sees it, stops its children (SIGTERM, then SIGKILL after a grace), writes
// what it has, and exits 128 + the signal with one line (issue 14).
#pragma once

#include <string>

namespace shardfit::executor {

// Installs the recording handler for SIGTERM and SIGINT (without
// SA_RESTART, so a blocking waitpid returns EINTR). Idempotent.
void install_stop_signal_handlers();
// The first stop signal received since the handlers were installed; 0 = none.
int stop_signal_received();
// "SIGTERM", "SIGINT", or "signal N".
std::string signal_name(int sig);

// Test hook: forget a recorded signal.
void reset_stop_signal_for_testing();

}  // namespace shardfit::executor
