#include "executor/watchdog.h"

#include <unistd.h>

#include <cstdio>

namespace shardfit::executor {

Watchdog::Watchdog(std::chrono::milliseconds limit, std::string what) {
  thread_ = std::thread([this, limit, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
    std::fprintf(
        stderr,
        "shardfit: %s did not finish within %.0f s (--timeout + %.0f s): giving up (exit 3)\n",
        what.c_str(), limit.count() / 1000.0, kWatchdogGrace.count() / 1000.0);
    std::fflush(stderr);
    _exit(3);  // the blocked call holds locks and sockets: no clean unwinding
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace shardfit::executor
