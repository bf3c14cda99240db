// The launcher: who this process is in a multi-rank run. With `--nproc N`
// the parent does what torchrun does on one node — picks a free port,
// starts N copies of this executable with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, prefixes their output
// with `[rank r]`, and waits. Without it, a rank reads those variables from
// its environment (set by this launcher, torchrun, or a Slurm/mpirun script).
//
// Failure (SPEC exit code 3): when a rank dies, the parent stops the others
// (SIGTERM, then SIGKILL after a grace period) and names the rank and how it
// died; when the run outlives its timeout, the parent stops every rank still
// running and names them. Children die with the parent (PR_SET_PDEATHSIG).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "executor/comm.h"

namespace shardfit::executor {

// torchrun's variables, as one rank sees them.
struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True);
  // keys then live under /worker/attempt_<TORCHELASTIC_RESTART_COUNT>.
  bool store_hosted_by_agent = false;
  std::string store_prefix;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (required)
// and LOCAL_WORLD_SIZE (default: WORLD_SIZE). A missing or malformed one
// throws std::invalid_argument naming it and suggesting --nproc or torchrun.
RankEnv rank_env_from_environment();

// The communicator options for this rank.
CommOptions comm_options_for(const RankEnv& env, Backend backend, std::chrono::milliseconds timeout);

struct LaunchOptions {
  // The whole run's wall-clock limit; a rank still running then is taken as
  // hung. Generous: a CPU training run of a big model takes minutes. 0: none.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Between SIGTERM and SIGKILL when stopping ranks.
  std::chrono::milliseconds kill_grace{std::chrono::seconds(5)};
  // How long the other ranks may run on after one died before they are
  // stopped. 0 (torchrun's behavior): at once. A few seconds lets the
  // survivors' own errors (which name the peer they lost) reach the log.
  std::chrono::milliseconds survivor_grace{0};
  // `run --save-on-signal`: the ranks catch SIGTERM/SIGINT themselves,
  // finish their step, save it and exit 128 + the signal (executor/signals.h).
  // A stop signal to this process is then passed on to them (instead of
  // SIGTERM, SIGKILL after kill_grace) and they get `save_on_signal_wait` to
  // save before SIGKILL; a second signal kills them at once. A rank that
  // exits 130/143 by itself (the signal reached the ranks only) interrupts
  // the run: it is not a failure, and the others are waited for alike.
  bool ranks_save_on_signal = false;
  std::chrono::milliseconds save_on_signal_wait{std::chrono::seconds(305)};
  // The program to start; argv[0] is passed as given.
  std::string executable = "/proc/self/exe";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port, chosen now
  // Receives each line of a rank's output (without the newline); by
  // default it is written to this process's stdout or stderr (the same one
  // the rank used) as "[rank r] line".
  std::function<void(int rank, bool is_stderr, const std::string& line)> on_line;
};

// How one rank ended.
struct RankExit {
  enum class How {
    kExited,    // code = exit status
    kSignaled,  // code = signal number, not sent by the launcher
    kStopped,   // stopped by the launcher (after another rank failed, or at the timeout)
  };
  int rank = 0;
  How how = How::kExited;
  int code = 0;
  std::string describe() const;  // "exited with code 1", "killed by signal 9 (Killed)"
};

struct LaunchResult {
  // 0 when every rank exited 0. Otherwise the exit code of the rank that
  // failed first if it is 1 or 2 (a rank's verdict per SPEC: check failed,
  // bad input), else 3 (the environment failed: crash, signal, timeout).
  int exit_code = 0;
  std::string error;             // one line naming the failed or hung ranks; empty on success
  std::vector<int> failed_ranks;  // ranks that failed or hung (not those stopped after)
  std::vector<RankExit> ranks;   // by rank
  int master_port = 0;
  // A stop signal (SIGTERM/SIGINT, executor/signals.h) this process got
  // while the ranks ran (or, with ranks_save_on_signal, one a rank exited
  // on): every rank was stopped; exit_code is 128 + it.
  int interrupted_by = 0;
  // ranks_save_on_signal: every rank exited 128 + a stop signal, i.e. all of
  // them saved the step they stopped at (else they were killed first, and
  // `error` says why).
  bool ranks_saved_on_signal = false;
};

// Starts `nproc` ranks of options.executable with `argv` (argv[0] first;
// strip --nproc with without_nproc_option) and waits for them.
// Throws std::invalid_argument for nproc < 1, std::runtime_error when it
// cannot start them (no free port, fork failed).
LaunchResult launch_local(int nproc, const std::vector<std::string>& argv, const LaunchOptions& options);

// argv without `--nproc N` / `--nproc=N`, so the children read their rank
// from the environment instead of launching again.
std::vector<std::string> without_nproc_option(const std::vector<std::string>& argv);

// A free TCP port on `addr` (bound to port 0 and released: the usual small
// race with other programs, as torchrun has).
int pick_free_port(const std::string& addr = "127.0.0.1");

// Where rank r writes its report when the run's report goes to `out`:
// "run.json" -> "run.rank0.json", "run.rank1.json", ... Merging is the
// caller's.
std::string rank_report_path(const std::string& out, int rank);
std::vector<std::string> rank_report_paths(const std::string& out, int world_size);

}  // namespace shardfit::executor
