// `shardfit run`'s helpers without LibTorch: the checks it makes before any
// rank starts (checkpoint paths, resume compatibility; each throws
// BadInput, one line naming the option), and small process utilities.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardfit::cli {

// The checkpoint's job (Engine::save's metadata "job") against this run's
// (the same keys): every key both have whose value differs, as
// "--seed 1234 -> 7". Keys only one side has are skipped (older checkpoints
// lack lr, weight_decay and clip_grad_norm).
std::vector<std::string> resume_option_changes(const nlohmann::json& saved,
                                               const nlohmann::json& now);

// Bounds of run's numeric options: beyond them a size overflows (batch x
// seq-len x world tokens) or the machine is swamped.
constexpr long long kMaxBatch = 1 << 20;
constexpr long long kMaxSeqLen = 1 << 20;
constexpr long long kMaxSteps = 1'000'000'000;
constexpr long long kMaxLocalRanks = 1024;  // even with --oversubscribe
constexpr long long kMaxWorld = 1 << 20;

// --nproc N on this machine: at most one rank per core, unless
// --oversubscribe (then kMaxLocalRanks).
void check_local_ranks(int nproc, bool oversubscribe);

// --save DIR: created if missing, and must be a writable directory.
void check_save_dir(const std::string& dir);
// --export FILE: not a directory, in an existing writable directory.
void check_export_path(const std::string& file);

// UTC now, "2026-11-30T09:00:00Z".
std::string now_iso8601();
// This process's argv, from /proc/self/cmdline.
std::vector<std::string> own_argv();
// Test-only: SHARDFIT_TEST_DIE_AT_STEP=K kills rank SHARDFIT_TEST_DIE_RANK
// (default 1) with SIGKILL as step K begins: a rank that dies mid-run.
std::function<void(int64_t)> test_death_hook(int rank);

}  // namespace shardfit::cli
