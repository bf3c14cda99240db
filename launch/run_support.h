// The run layer's helpers without LibTorch: the checks it makes before any
// rank starts (checkpoint paths, resume compatibility; each throws
// spec::BadInput, one line naming the option), how --save-on-signal's ranks and
// launcher end, and small process utilities.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace shardfit::launch {

// The checkpoint's job (Engine::save's metadata "job") against this run's
// (the same keys): every key both have whose value differs, as
// "--seed 1234 -> 7". Keys only one side has are skipped (older checkpoints
// lack lr, weight_decay and clip_grad_norm).
std::vector<std::string> resume_option_changes(const nlohmann::json& saved,
                                               const nlohmann::json& now);

// --nproc N on this machine: at most one rank per core, unless
// --oversubscribe (then spec::kMaxLocalRanks).
void check_local_ranks(int nproc, bool oversubscribe);

// --save DIR: created if missing, and must be a writable directory.
void check_save_dir(const std::string& dir);
// --export FILE: not a directory, in an existing writable directory.
void check_export_path(const std::string& file);
// --save-on-signal: what the ranks did when a stop signal reached the job.
struct SavedOnSignal {
  int signal = 0;          // the signal the ranks agreed to stop on
  int64_t step = 0;        // the step every rank finished and saved
  std::string checkpoint;  // its committed directory, DIR/step-NNNNNN
};
// Under `--nproc`, rank 0 tells the launcher what was saved through a small
// JSON file that the launcher names in this variable, so that the job still
// ends with one line (the launcher's).
constexpr const char* kStopNoteVariable = "SHARDFIT_STOP_NOTE";
// The launcher: a fresh note path in the temporary directory, exported to
// the ranks it starts.
std::string export_stop_note_path();
// The launcher, after its ranks: the note rank 0 left (removed), if any.
std::optional<SavedOnSignal> take_stop_note(const std::string& path);
// "interrupted by SIGTERM: all 2 rank(s) finished step 3 and saved it to
// ckpt/step-000003 (--resume ckpt continues from there)"
std::string saved_on_signal_line(const SavedOnSignal& saved, int ranks, const std::string& save_root);
// A rank that stopped after saving: rank 0 (`leader`) under the launcher
// writes the note, alone or under torchrun throws Interrupted with the one
// line (+ "; report FILE"); the other ranks exit quietly. Returns 128 + the
// signal.
int end_rank_saved_on_signal(bool leader, const SavedOnSignal& saved, int ranks, const std::string& save_root,
                             const std::string& report);

// UTC now, "2026-11-30T09:00:00Z".
std::string now_iso8601();
// This process's argv, from /proc/self/cmdline.
std::vector<std::string> own_argv();
// Test-only: SHARDFIT_TEST_DIE_AT_STEP=K kills rank SHARDFIT_TEST_DIE_RANK
// (default 1) with SIGKILL as step K begins: a rank that dies mid-run.
std::function<void(int64_t)> test_death_hook(int rank);

}  // namespace shardfit::launch
