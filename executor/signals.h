// SIGTERM / SIGINT. Two kinds of process catch them:
//  - processes that own children (`run`'s launcher, `validate`): the handler
//    only records the signal; the owner's wait loop sees it, stops its
//    children (SIGTERM, then SIGKILL after a grace), writes what it has, and
//    exits 128 + the signal with one line. Under `run --save-on-signal` the
//    launcher passes the signal on instead and waits for the ranks to save;
//    a second signal kills them at once.
//  - the ranks of `run --save-on-signal` (under the launcher, torchrun or
//    Slurm, or alone): the first signal is a request, polled after every
//    step (the engine's stop agreement). A stop passed on by the parent
//    (our launcher, torchrun's agent) is that same request, before or after
//    the rank's own copy of a Ctrl-C; a second signal from anyone else ends
//    the rank at once with the default action, so a save that hangs can
//    always be cut short.
#pragma once

#include <string>

namespace shardfit::executor {

// Installs the recording handler for SIGTERM and SIGINT (without
// SA_RESTART, so a blocking waitpid returns EINTR). Idempotent.
void install_stop_signal_handlers();
// The rank's handler (see above), with SA_RESTART: a request must not
// interrupt the store's or Gloo's system calls mid-step. Idempotent.
void install_save_on_signal_handlers();
// The first stop signal received since the handlers were installed; 0 = none.
int stop_signal_received();
// How many stop signals arrived (a second one: stop at once); the ranks'
// handler leaves out those their parent passed on.
int stop_signals_received_count();
// "SIGTERM", "SIGINT", or "signal N".
std::string signal_name(int sig);

// Test hook: forget a recorded signal.
void reset_stop_signal_for_testing();

}  // namespace shardfit::executor
