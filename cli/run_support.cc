#include "cli/run_support.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <system_error>

#include "cli/commands.h"

namespace shardfit::cli {
namespace fs = std::filesystem;

std::vector<std::string> resume_option_changes(const nlohmann::json& saved,
                                               const nlohmann::json& now) {
  // The job's keys, as the options that set them are spelled.
  static const std::map<std::string, std::string> kOption = {
      {"candidate", "--strategy"},        {"batch_per_gpu", "--batch"},
      {"seq_len", "--seq-len"},           {"grad_accum", "--grad-accum"},
      {"seed", "--seed"},                 {"data", "--data"},
      {"lr", "--lr"},                     {"weight_decay", "--weight-decay"},
      {"clip_grad_norm", "--clip-grad-norm"}};
  std::vector<std::string> out;
  if (!saved.is_object() || !now.is_object()) return out;
  for (auto it = now.begin(); it != now.end(); ++it) {
    const auto was = saved.find(it.key());
    if (was == saved.end()) continue;
    if (*was == it.value()) continue;
    const auto name = kOption.find(it.key());
    out.push_back((name != kOption.end() ? name->second : it.key()) + " " + was->dump() + " -> " +
                  it.value().dump());
  }
  return out;
}

void check_local_ranks(int nproc, bool oversubscribe) {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  if (nproc > kMaxLocalRanks)
    throw BadInput("--nproc " + std::to_string(nproc) + ": at most " +
                   std::to_string(kMaxLocalRanks) + " local ranks");
  if (nproc > cores && !oversubscribe)
    throw BadInput("--nproc " + std::to_string(nproc) + ": more ranks than the " +
                   std::to_string(cores) +
                   " cores of this machine (add --oversubscribe to run them anyway)");
}

void check_save_dir(const std::string& dir) {
  if (dir.empty()) throw BadInput("--save \"\": needs a directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    throw BadInput("--save " + dir + ": not a directory that can be created (" +
                   (ec ? ec.message() : std::string("a file is in the way")) + ")");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw BadInput("--save " + dir + ": the directory is not writable");
}

void check_export_path(const std::string& file) {
  if (file.empty()) throw BadInput("--export \"\": needs a file name");
  std::error_code ec;
  if (fs::is_directory(file, ec))
    throw BadInput("--export " + file + ": is a directory, expected a file name");
  fs::path parent = fs::path(file).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    throw BadInput("--export " + file + ": no directory " + parent.string());
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw BadInput("--export " + file + ": directory " + parent.string() + " is not writable");
}

std::string now_iso8601() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  std::string arg;
  while (std::getline(f, arg, '\0')) argv.push_back(arg);
  return argv;
}

std::function<void(int64_t)> test_death_hook(int rank) {
  const char* at = std::getenv("SHARDFIT_TEST_DIE_AT_STEP");
  if (at == nullptr) return {};
  const int64_t step = std::atoll(at);
  const char* who = std::getenv("SHARDFIT_TEST_DIE_RANK");
  const int victim = who ? std::atoi(who) : 1;
  if (rank != victim) return {};
  return [step](int64_t s) {
    if (s != step) return;
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
}

}  // namespace shardfit::cli
