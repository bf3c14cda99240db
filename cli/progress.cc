#include "cli/progress.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include <cstdio>
#include <stdexcept>

#include "executor/engine.h"

#ifndef SHARDFIT_VERSION
#define SHARDFIT_VERSION "unknown"
#endif

namespace shardfit::cli {

void configure_logging(const std::string& level, bool quiet) {
  spdlog::level::level_enum l = spdlog::level::from_str(level);
  // from_str maps anything unknown to off: only "off" itself may mean off.
  if (l == spdlog::level::off && level != "off")
    throw std::invalid_argument("--log-level " + level +
                                ": expected trace, debug, info, warn, error or off");
  if (quiet && l < spdlog::level::warn) l = spdlog::level::warn;
  auto logger = spdlog::stderr_color_mt("shardfit");
  spdlog::set_default_logger(logger);
  spdlog::set_level(l);
}

std::string format_duration(double seconds) {
  if (seconds < 0) seconds = 0;
  const long long s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string eta_text(double elapsed_s, size_t done, size_t total) {
  if (done == 0 || done >= total) return "";
  return "ETA " +
         format_duration(elapsed_s / static_cast<double>(done) * static_cast<double>(total - done));
}

Progress::Progress(std::string what, size_t total)
    : what_(std::move(what)), total_(total), begin_(std::chrono::steady_clock::now()) {}

void Progress::start(const std::string& label) {
  const size_t done = started_++;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  const std::string eta = eta_text(elapsed, done, total_);
  spdlog::info("{} {}/{} ({}%) {}, {} elapsed{}{}", what_, started_, total_,
               total_ ? 100 * done / total_ : 0, label, format_duration(elapsed),
               eta.empty() ? "" : ", ", eta);
}

ThrottledProgress::ThrottledProgress(double interval_s)
    : interval_s_(interval_s), begin_(std::chrono::steady_clock::now()) {}

void ThrottledProgress::done(const std::string& what, size_t done, size_t total,
                             const std::string& label) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  const bool due = elapsed - last_s_ >= interval_s_;
  if (!due && !spdlog::should_log(spdlog::level::debug)) return;
  const std::string eta = eta_text(elapsed, done, total);
  spdlog::log(due ? spdlog::level::info : spdlog::level::debug, "{} {}/{} ({}%) {}, {} elapsed{}{}",
              what, done, total, total ? 100 * done / total : 0, label, format_duration(elapsed),
              eta.empty() ? "" : ", ", eta);
  if (due) last_s_ = elapsed;
}

std::string version_text() {
  std::string v = std::string("shardfit ") + SHARDFIT_VERSION + "\nLibTorch " + TORCH_VERSION;
  v += executor::engine_supports_cuda() ? "\nCUDA: yes (LibTorch built with CUDA)"
                                        : "\nCUDA: no (LibTorch for CPU)";
  v += executor::engine_supports_nccl() ? "\nNCCL: yes" : "\nNCCL: no";
  return v;
}

}  // namespace shardfit::cli
