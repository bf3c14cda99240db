#include "executor/signals.h"

#include <signal.h>

#include <cstring>

namespace shardfit::executor {
namespace {

volatile sig_atomic_t g_signal = 0;

extern "C" void record_stop_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
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

int stop_signal_received() { return g_signal; }

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

void reset_stop_signal_for_testing() { g_signal = 0; }

}  // namespace shardfit::executor
