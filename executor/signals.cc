#include "executor/signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace shardfit::executor {
namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_count = 0;

extern "C" void record_stop_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_count = g_count + 1;
}

// Only async-signal-safe calls here (getppid, signal, raise).
extern "C" void record_save_request(int sig, siginfo_t* info, void*) {
  if (g_signal == 0) g_signal = sig;
  // The parent passing on a stop (our launcher, torchrun's agent) is the
  // same request, whichever copy comes first: a Ctrl-C reaches the ranks
  // and the launcher at once, and the launcher's copy can arrive first.
  if (info != nullptr && info->si_code == SI_USER && info->si_pid == getppid()) return;
  g_count = g_count + 1;
  if (g_count < 2) return;
  signal(sig, SIG_DFL);  // a second request: stop at once, as without --save-on-signal
  raise(sig);            // delivered with the default action when the handler returns
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: blocking waits return EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void install_save_on_signal_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = record_save_request;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal_received() { return g_signal; }

int stop_signals_received_count() { return g_count; }

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

void reset_stop_signal_for_testing() {
  g_signal = 0;
  g_count = 0;
}

}  // namespace shardfit::executor
