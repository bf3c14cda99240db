// A deadline for a wait this process cannot bound itself: Gloo's
// connect and the TCPStore handshake can block past --timeout (a busy
// MASTER_PORT whose owner never answers). If the guarded scope is still
// running `limit` after it began, the watchdog prints one line naming what
// it waited for and ends the process with exit 3 (SPEC: the environment
// failed); leaving the scope disarms it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace shardfit::executor {

class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds limit, std::string what);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The grace a watchdog gives on top of --timeout: the wait's own timeout
// fires first when it works.
constexpr std::chrono::milliseconds kWatchdogGrace{5000};

}  // namespace shardfit::executor
