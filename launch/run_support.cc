#include "launch/run_support.h"

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

#include "launch/output_file.h"
#include "spec/errors.h"
#include "spec/job.h"
#include "executor/signals.h"

namespace shardfit::launch {
namespace fs = std::filesystem;
using spec::BadInput;
using spec::Interrupted;
using spec::kMaxLocalRanks;

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

void check_export_path(const std::string& file) { check_output_file("--export", file); }

std::string export_stop_note_path() {
  const std::string path =
      (fs::temp_directory_path() / ("shardfit-stop-" + std::to_string(::getpid()) + ".json")).string();
  std::error_code ec;
  fs::remove(path, ec);  // a note left by an earlier process of this pid is not this job's
  ::setenv(kStopNoteVariable, path.c_str(), 1);
  return path;
}

std::optional<SavedOnSignal> take_stop_note(const std::string& path) {
  std::optional<SavedOnSignal> s;
  if (std::ifstream f(path); f) {
    try {
      const nlohmann::json j = nlohmann::json::parse(f);
      s = SavedOnSignal{j.at("signal").get<int>(), j.at("step").get<int64_t>(),
                        j.at("checkpoint").get<std::string>()};
    } catch (const std::exception&) {
      s.reset();  // unreadable: the launcher says what it knows
    }
  }
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(path + ".tmp", ec);  // rank 0 killed while writing it
  return s;
}

std::string saved_on_signal_line(const SavedOnSignal& saved, int ranks, const std::string& save_root) {
  return "interrupted by " + executor::signal_name(saved.signal) + ": all " + std::to_string(ranks) +
         " rank(s) finished step " + std::to_string(saved.step) + " and saved it to " + saved.checkpoint +
         " (--resume " + save_root + " continues from there)";
}

int end_rank_saved_on_signal(bool leader, const SavedOnSignal& saved, int ranks, const std::string& save_root,
                             const std::string& report) {
  if (!leader) return 128 + saved.signal;
  const char* note = std::getenv(kStopNoteVariable);
  if (note != nullptr && std::getenv("RANK") != nullptr) {
    // Written whole, then renamed: the launcher never reads half a note.
    const std::string tmp = std::string(note) + ".tmp";
    std::ofstream(tmp) << nlohmann::json{{"signal", saved.signal}, {"step", saved.step},
                                         {"checkpoint", saved.checkpoint}}.dump()
                       << "\n";
    std::error_code ec;
    fs::rename(tmp, note, ec);
    if (!ec) return 128 + saved.signal;
  }
  throw Interrupted(saved_on_signal_line(saved, ranks, save_root) + (report.empty() ? "" : "; report " + report),
                    saved.signal);
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

}  // namespace shardfit::launch
