// Logs and progress (SPEC: results on stdout, logs on stderr).
//  - configure_logging: the default spdlog logger writes to stderr at
//    --log-level (trace, debug, info, warn, error, off); --quiet is warn.
//  - Progress: "validate 3/56 (5%) zero2/fp32/wrap=block batch 9, 0:40
//    elapsed, ETA 11:50" lines on stderr for long commands.
//  - version_text: what --version prints.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace shardfit::cli {

// Throws std::invalid_argument naming the level when it is not one of
// spdlog's names. `quiet` wins over `level` unless `level` is quieter.
void configure_logging(const std::string& level, bool quiet);

// "0:07", "12:40", "1:02:03".
std::string format_duration(double seconds);

// "ETA 1:20" from `done` of `total` units in `elapsed_s`; "" until one is done.
std::string eta_text(double elapsed_s, size_t done, size_t total);

class Progress {
 public:
  Progress(std::string what, size_t total);
  // Logs "WHAT i/total (p%) LABEL, elapsed, ETA" as unit i (1-based) starts;
  // the ETA is from the units finished before it.
  void start(const std::string& label);

 private:
  std::string what_;
  size_t total_;
  size_t started_ = 0;
  std::chrono::steady_clock::time_point begin_;
};

// Progress of a command whose units finish in any order and may be many and
// quick (`plan`'s candidates): "WHAT 12/76 (15%) LABEL, 0:03 elapsed, ETA
// 0:15" as unit `done` finishes, at most one line a second (every unit at
// --log-level debug), the first one second after the start, so quick
// commands stay quiet. Not thread-safe: callers serialise.
class ThrottledProgress {
 public:
  explicit ThrottledProgress(double interval_s = 1.0);
  void done(const std::string& what, size_t done, size_t total, const std::string& label);

 private:
  double interval_s_;
  std::chrono::steady_clock::time_point begin_;
  double last_s_ = 0;
};

// "shardfit 0.2.0 (LibTorch 1.13.0, CPU only)", one line per fact.
std::string version_text();

}  // namespace shardfit::cli
