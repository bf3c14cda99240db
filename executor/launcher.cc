// The launcher: torchrun's environment contract, and `--nproc` local ranks
// as child processes with prefixed output and failure handling.
#include "executor/launcher.h"

#include "executor/signals.h"
#include "spec/exit_codes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

extern char** environ;

namespace shardfit::executor {
namespace {

using Clock = std::chrono::steady_clock;

// SPEC's exit codes, as ranks and the launcher use them.
using spec::kExitBadInput;
using spec::kExitCheckFailed;
using spec::kExitEnvironment;

std::string seconds_str(std::chrono::milliseconds t) {
  char s[32];
  std::snprintf(s, sizeof(s), "%g s", t.count() / 1000.0);
  return s;
}

const char* const kRunnerHint = ": run under torchrun, or pass --nproc N to start local ranks";

int env_int(const char* name, bool required, int fallback, int min, int max) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) throw std::invalid_argument(std::string(name) + " is not set" + kRunnerHint);
    return fallback;
  }
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (errno || *end || end == v)
    throw std::invalid_argument(std::string(name) + "=" + v + ": not an integer" + kRunnerHint);
  if (x < min || x > max)
    throw std::invalid_argument(std::string(name) + "=" + v + ": must be in " + std::to_string(min) +
                                ".." + std::to_string(max));
  return static_cast<int>(x);
}

std::string join_ranks(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// Variables the launcher sets for its children; inherited values are dropped.
const char* const kRankVariables[] = {
    "RANK",      "WORLD_SIZE", "LOCAL_RANK",      "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "GROUP_RANK", "ROLE_RANK",     "ROLE_WORLD_SIZE",  "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT"};

bool is_rank_variable(const char* entry) {
  for (const char* name : kRankVariables) {
    size_t n = std::strlen(name);
    if (std::strncmp(entry, name, n) == 0 && entry[n] == '=') return true;
  }
  return false;
}

// One child's output stream, cut into lines.
struct OutputPipe {
  int fd = -1;
  int rank = 0;
  bool is_stderr = false;
  std::string partial;
};

// Longest line kept whole; longer output without a newline is passed on in
// pieces of this size.
constexpr size_t kMaxLineBytes = 64 * 1024;

struct Child {
  pid_t pid = -1;
  bool running = true;
  bool stop_sent = false;  // SIGTERM from us
  bool kill_sent = false;  // SIGKILL from us
  RankExit exit;
};

void default_line_sink(int rank, bool is_stderr, const std::string& line) {
  std::FILE* f = is_stderr ? stderr : stdout;
  std::fprintf(f, "[rank %d] %s\n", rank, line.c_str());
  std::fflush(f);
}

}  // namespace

RankEnv rank_env_from_environment() {
  RankEnv e;
  e.world_size = env_int("WORLD_SIZE", true, 1, 1, 1 << 20);
  e.rank = env_int("RANK", true, 0, 0, e.world_size - 1);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", false, e.world_size, 1, e.world_size);
  e.local_rank = env_int("LOCAL_RANK", true, 0, 0, e.local_world_size - 1);
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) throw std::invalid_argument(std::string("MASTER_ADDR is not set") + kRunnerHint);
  e.master_addr = addr;
  e.master_port = env_int("MASTER_PORT", true, 0, 1, 65535);
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  e.store_hosted_by_agent = agent && std::string(agent) == "True";
  if (e.store_hosted_by_agent)
    e.store_prefix = "/worker/attempt_" +
                     std::to_string(env_int("TORCHELASTIC_RESTART_COUNT", false, 0, 0, 1 << 20));
  return e;
}

CommOptions comm_options_for(const RankEnv& env, Backend backend, std::chrono::milliseconds timeout) {
  CommOptions o;
  o.backend = backend;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.master_addr = env.master_addr;
  o.master_port = env.master_port;
  o.timeout = timeout;
  o.store_hosted_by_agent = env.store_hosted_by_agent;
  o.store_prefix = env.store_prefix;
  return o;
}

std::string RankExit::describe() const {
  switch (how) {
    case How::kExited: return "exited with code " + std::to_string(code);
    case How::kSignaled: {
      const char* name = strsignal(code);
      return "was killed by signal " + std::to_string(code) + (name ? std::string(" (") + name + ")" : "");
    }
    case How::kStopped: return "was stopped by the launcher";
  }
  return "?";
}

std::vector<std::string> without_nproc_option(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i > 0 && argv[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (i > 0 && argv[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

int pick_free_port(const std::string& addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw std::runtime_error(std::string("cannot pick a free port: socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  const std::string ip = addr == "localhost" ? "127.0.0.1" : addr;
  if (inet_pton(AF_INET, ip.c_str(), &sa.sin_addr) != 1) {
    close(fd);
    throw std::invalid_argument("master address " + addr + ": not an IPv4 address");
  }
  socklen_t len = sizeof(sa);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int err = errno;
    close(fd);
    throw std::runtime_error("cannot pick a free port on " + addr + ": " + std::strerror(err));
  }
  close(fd);
  return ntohs(sa.sin_port);
}

std::string rank_report_path(const std::string& out, int rank) {
  const std::string ext = ".json";
  std::string base = out;
  if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0)
    base.resize(base.size() - ext.size());
  return base + ".rank" + std::to_string(rank) + ext;
}

std::vector<std::string> rank_report_paths(const std::string& out, int world_size) {
  std::vector<std::string> paths;
  for (int r = 0; r < world_size; ++r) paths.push_back(rank_report_path(out, r));
  return paths;
}

namespace {

// What every rank's environment shares: this process's, without the rank
// variables the launcher sets itself, and OMP_NUM_THREADS=1 for several
// ranks unless it is set (as torchrun does: N ranks each using every core
// oversubscribe the CPU).
std::vector<std::string> shared_rank_environment(int nproc) {
  std::vector<std::string> env;
  bool omp_set = false;
  for (char** e = environ; *e; ++e) {
    if (is_rank_variable(*e)) continue;
    if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) == 0) omp_set = true;
    env.push_back(*e);
  }
  if (!omp_set && nproc > 1) {
    spdlog::warn("setting OMP_NUM_THREADS=1 for each of the {} ranks (set it yourself to override)", nproc);
    env.push_back("OMP_NUM_THREADS=1");
  }
  return env;
}

// Starts rank `r`: its environment (torchrun's variables), its stdout and
// stderr as non-blocking pipes appended to `pipes`, then fork and exec.
// Everything the child needs is built before fork: between fork and exec a
// child of a multi-threaded parent may only make async-signal-safe calls.
// Throws std::runtime_error; the caller stops the ranks already started.
pid_t start_rank(int r, int nproc, int master_port, const std::vector<std::string>& shared_env,
                 const std::vector<const char*>& child_argv, const LaunchOptions& options,
                 std::vector<OutputPipe>& pipes) {
  std::vector<std::string> env = shared_env;
  auto set = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  set("RANK", std::to_string(r));
  set("WORLD_SIZE", std::to_string(nproc));
  set("LOCAL_RANK", std::to_string(r));
  set("LOCAL_WORLD_SIZE", std::to_string(nproc));
  set("GROUP_RANK", "0");
  set("ROLE_RANK", std::to_string(r));
  set("ROLE_WORLD_SIZE", std::to_string(nproc));
  set("MASTER_ADDR", options.master_addr);
  set("MASTER_PORT", std::to_string(master_port));
  std::vector<const char*> envp;
  for (const auto& kv : env) envp.push_back(kv.c_str());
  envp.push_back(nullptr);

  int out[2], err[2];
  // O_CLOEXEC: a later child must not inherit this child's pipes, or they
  // would never reach end-of-file.
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error("cannot start rank " + std::to_string(r) + ": pipe: " + std::strerror(errno));
  const pid_t parent = getpid();
  const char* exec_failed = "launcher: cannot execute the program\n";
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot start rank " + std::to_string(r) + ": fork: " + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank must not outlive its launcher
    if (getppid() != parent) _exit(125);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(options.executable.c_str(), const_cast<char* const*>(child_argv.data()),
           const_cast<char* const*>(envp.data()));
    ssize_t ignored = write(2, exec_failed, std::strlen(exec_failed));
    (void)ignored;
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  pipes.push_back({out[0], r, false, {}});
  pipes.push_back({err[0], r, true, {}});
  return pid;
}

using LineSink = std::function<void(int rank, bool is_stderr, const std::string& line)>;

// Passes on every whole line a pipe holds now (a line over kMaxLineBytes in
// pieces); at its end, what is left, and closes it.
void drain_pipe(OutputPipe& p, const LineSink& sink) {
  char buf[8192];
  for (;;) {
    ssize_t n = read(p.fd, buf, sizeof(buf));
    if (n > 0) {
      p.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = p.partial.find('\n', start)) != std::string::npos) {
        sink(p.rank, p.is_stderr, p.partial.substr(start, nl - start));
        start = nl + 1;
      }
      p.partial.erase(0, start);
      while (p.partial.size() >= kMaxLineBytes) {
        sink(p.rank, p.is_stderr, p.partial.substr(0, kMaxLineBytes));
        p.partial.erase(0, kMaxLineBytes);
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    // End of file (or an error): pass on what is left.
    if (!p.partial.empty()) sink(p.rank, p.is_stderr, p.partial);
    p.partial.clear();
    close(p.fd);
    p.fd = -1;
    return;
  }
}

// The running ranks' supervision, one poll round at a time: stop signals to
// this process, ranks that ended, and what follows (a failed rank stops the
// others, after options.survivor_grace; a timeout stops them all; with
// ranks_save_on_signal the ranks get options.save_on_signal_wait to save).
class Supervisor {
 public:
  Supervisor(std::vector<Child>& children, const LaunchOptions& options, LaunchResult& result)
      : children_(children), options_(options), result_(result), start_(Clock::now()) {}

  // `sig` to every running rank (one never started has no pid).
  void stop(int sig) {
    for (auto& c : children_)
      if (c.running && c.pid > 0) {
        kill(c.pid, sig);
        (sig == SIGKILL ? c.kill_sent : c.stop_sent) = true;
      }
  }

  // True once every rank is reaped and its output read (or a second has
  // passed since: a grandchild may hold a pipe open).
  bool finished(bool output_open) const {
    return all_reaped_ && (!output_open || Clock::now() - all_reaped_at_ > std::chrono::seconds(1));
  }

  void round() {
    on_stop_signals();
    const std::vector<int> failures = reap();
    advance(failures);
  }

  bool timed_out = false;
  bool killed_while_saving = false;  // a second signal (ranks_save_on_signal)
  bool drain_timed_out = false;

 private:
  // kDraining (ranks_save_on_signal): the ranks were asked to stop and are
  // saving; they get until drain_until_.
  enum class Phase { kRunning, kSurvivorGrace, kDraining, kStopping };

  void begin_stopping() {
    phase_ = Phase::kStopping;
    stop(SIGTERM);
    kill_at_ = Clock::now() + options_.kill_grace;
  }
  void kill_now() {
    phase_ = Phase::kStopping;
    stop(SIGKILL);
    kill_at_ = Clock::now();
  }
  void begin_draining() {
    phase_ = Phase::kDraining;
    drain_until_ = Clock::now() + options_.save_on_signal_wait;
  }
  // A rank of a --save-on-signal job that saved and stopped (not a failure).
  bool saved_and_stopped(int status) const {
    return options_.ranks_save_on_signal && WIFEXITED(status) &&
           (WEXITSTATUS(status) == 128 + SIGTERM || WEXITSTATUS(status) == 128 + SIGINT);
  }
  bool any_running() const {
    return std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; });
  }

  // SIGTERM/SIGINT to this process: stop every rank, report it as such.
  // With ranks_save_on_signal the first is passed on (the ranks save, then
  // stop) and a second kills them at once.
  void on_stop_signals() {
    if (phase_ == Phase::kStopping || stop_signals_received_count() <= signals_seen_) return;
    const int sig = stop_signal_received();
    if (result_.interrupted_by == 0) result_.interrupted_by = sig;
    if (!options_.ranks_save_on_signal || phase_ == Phase::kSurvivorGrace) {
      begin_stopping();
    } else if (stop_signals_received_count() >= 2) {
      killed_while_saving = true;
      spdlog::warn("{} again: killing the ranks now (the last committed checkpoint stays as it is)",
                   signal_name(sig));
      kill_now();
    } else {
      for (auto& c : children_)
        if (c.running) kill(c.pid, sig);  // a request, not SIGTERM's end: stop_sent stays false
      if (phase_ == Phase::kRunning) begin_draining();
    }
    signals_seen_ = stop_signals_received_count();
  }

  // The ranks that ended since the last round. Failures found in one pass
  // are reported together: the rank that died and a survivor whose
  // collective failed at once can end within the same few milliseconds.
  std::vector<int> reap() {
    std::vector<int> failures;
    for (auto& c : children_) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      if (c.stop_sent || c.kill_sent) {
        c.exit.how = RankExit::How::kStopped;
        c.exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
      } else if (WIFEXITED(status)) {
        c.exit.how = RankExit::How::kExited;
        c.exit.code = WEXITSTATUS(status);
        if (saved_and_stopped(status)) {  // the signal reached the ranks: wait for the others alike
          if (result_.interrupted_by == 0) result_.interrupted_by = c.exit.code - 128;
          if (phase_ == Phase::kRunning) begin_draining();
        } else if (c.exit.code != 0) {
          failures.push_back(c.exit.rank);
        }
      } else {
        c.exit.how = RankExit::How::kSignaled;
        c.exit.code = WTERMSIG(status);
        failures.push_back(c.exit.rank);
      }
    }
    if (!any_running() && !all_reaped_) {
      all_reaped_ = true;
      all_reaped_at_ = Clock::now();
    }
    return failures;
  }

  void advance(const std::vector<int>& failures) {
    const auto now = Clock::now();
    const bool running = any_running();
    if (phase_ == Phase::kRunning && !failures.empty()) {
      result_.failed_ranks = failures;
      std::string next;
      if (running)
        next = options_.survivor_grace.count() > 0
                   ? "; the other ranks may run on for " + seconds_str(options_.survivor_grace)
                   : "; stopping the other ranks";
      for (int r : failures) spdlog::warn("rank {} {}{}", r, children_[r].exit.describe(), next);
      if (options_.survivor_grace.count() > 0) {
        phase_ = Phase::kSurvivorGrace;
        grace_end_ = now + options_.survivor_grace;
      } else {
        begin_stopping();
      }
    } else if (phase_ == Phase::kRunning && options_.timeout.count() > 0 && now - start_ > options_.timeout &&
               running) {
      timed_out = true;
      for (const auto& c : children_)
        if (c.running) result_.failed_ranks.push_back(c.exit.rank);
      spdlog::warn("run timed out after {}; stopping rank(s) {}", seconds_str(options_.timeout),
                   join_ranks(result_.failed_ranks));
      begin_stopping();
    } else if (phase_ == Phase::kSurvivorGrace) {
      // Ranks that fail on their own now are failures too (usually
      // collectives that lost the first one); the culprit is sorted first.
      for (int r : failures) {
        result_.failed_ranks.push_back(r);
        spdlog::warn("rank {} {}", r, children_[r].exit.describe());
      }
      if (now > grace_end_ && running) begin_stopping();
    } else if (phase_ == Phase::kDraining) {
      // A rank that fails while saving leaves the others waiting in a collective.
      for (int r : failures) {
        result_.failed_ranks.push_back(r);
        spdlog::warn("rank {} {} while the ranks were saving; stopping the others", r,
                     children_[r].exit.describe());
      }
      if (!failures.empty() && running) {
        begin_stopping();
      } else if (now > drain_until_ && running) {
        drain_timed_out = true;
        for (const auto& c : children_)
          if (c.running) result_.failed_ranks.push_back(c.exit.rank);
        spdlog::warn("rank(s) {} did not save within {}; killing them", join_ranks(result_.failed_ranks),
                     seconds_str(options_.save_on_signal_wait));
        kill_now();
      }
    }
    if (phase_ == Phase::kStopping && now > kill_at_ && running) {
      bool first = false;
      for (const auto& c : children_) first |= c.running && !c.kill_sent;
      if (first) stop(SIGKILL);
    }
  }

  std::vector<Child>& children_;
  const LaunchOptions& options_;
  LaunchResult& result_;
  const Clock::time_point start_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point grace_end_{}, kill_at_{}, drain_until_{}, all_reaped_at_{};
  bool all_reaped_ = false;
  int signals_seen_ = 0;  // stop signals to this process acted on so far
};

// An interrupted job's exit code and error line (interrupted_by set).
void conclude_interrupted(LaunchResult& result, const LaunchOptions& options, int nproc, const Supervisor& s) {
  result.exit_code = 128 + result.interrupted_by;
  const std::string by = "interrupted by " + signal_name(result.interrupted_by) + ": ";
  if (!options.ranks_save_on_signal) {
    result.error = by + "stopped all " + std::to_string(nproc) + " rank(s)";
    return;
  }
  auto all_exited = [&](auto code_ok) {
    return std::all_of(result.ranks.begin(), result.ranks.end(), [&](const RankExit& e) {
      return e.how == RankExit::How::kExited && code_ok(e.code);
    });
  };
  if (all_exited([](int code) { return code == 0; })) {  // the signal came during the last step
    spdlog::warn("{} came too late to stop the run: it finished", signal_name(result.interrupted_by));
    result.interrupted_by = 0;
    result.exit_code = 0;
    return;
  }
  if (all_exited([](int code) { return code == 128 + SIGTERM || code == 128 + SIGINT; })) {
    result.ranks_saved_on_signal = true;
    result.error = by + "all " + std::to_string(nproc) + " rank(s) saved and stopped";
    return;
  }
  if (s.killed_while_saving)
    result.error = by + "a second signal killed all " + std::to_string(nproc) +
                   " rank(s) (a save in progress is not committed; the last committed checkpoint is kept)";
  else if (s.drain_timed_out)
    result.error = by + "rank(s) " + join_ranks(result.failed_ranks) + " had not saved after " +
                   seconds_str(options.save_on_signal_wait) + ", killed";
  else if (!result.failed_ranks.empty())
    result.error = by + "rank " + std::to_string(result.failed_ranks.front()) + " " +
                   result.ranks[result.failed_ranks.front()].describe() + " before saving; stopped all";
  else
    result.error = by + "stopped all " + std::to_string(nproc) + " rank(s) before they had saved";
}

// A failed job's exit code and error line. The culprit: a rank that crashed
// or gave its own verdict comes before a rank that exited 3 because a
// collective with the culprit failed.
void conclude_failed(LaunchResult& result) {
  std::vector<int> order = result.failed_ranks;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    auto victim = [&](int r) {
      const RankExit& e = result.ranks[r];
      return e.how == RankExit::How::kExited && e.code == kExitEnvironment;
    };
    return !victim(a) && victim(b);
  });
  const RankExit& culprit = result.ranks[order.front()];
  const bool verdict = culprit.how == RankExit::How::kExited &&
                       (culprit.code == kExitCheckFailed || culprit.code == kExitBadInput);
  result.exit_code = verdict ? culprit.code : kExitEnvironment;
  result.error = "rank " + std::to_string(culprit.rank) + " " + culprit.describe();
  for (size_t i = 1; i < order.size(); ++i)
    result.error += ", rank " + std::to_string(order[i]) + " " + result.ranks[order[i]].describe();
  std::vector<int> stopped;
  for (const auto& e : result.ranks)
    if (e.how == RankExit::How::kStopped) stopped.push_back(e.rank);
  if (!stopped.empty()) result.error += "; stopped rank(s) " + join_ranks(stopped);
}

}  // namespace

LaunchResult launch_local(int nproc, const std::vector<std::string>& argv, const LaunchOptions& options) {
  if (nproc < 1) throw std::invalid_argument("--nproc " + std::to_string(nproc) + ": must be at least 1");
  if (argv.empty())
    throw std::invalid_argument("launch_local: argv is empty (argv[0] is the program name)");
  LaunchResult result;
  result.master_port = options.master_port > 0 ? options.master_port : pick_free_port(options.master_addr);
  const LineSink sink = options.on_line ? options.on_line : default_line_sink;
  const std::vector<std::string> shared_env = shared_rank_environment(nproc);
  std::vector<const char*> child_argv;
  for (const auto& a : argv) child_argv.push_back(a.c_str());
  child_argv.push_back(nullptr);

  std::vector<Child> children(static_cast<size_t>(nproc));
  std::vector<OutputPipe> pipes;
  Supervisor supervisor(children, options, result);
  for (int r = 0; r < nproc; ++r) {
    try {
      children[r].pid = start_rank(r, nproc, result.master_port, shared_env, child_argv, options, pipes);
    } catch (const std::runtime_error&) {
      supervisor.stop(SIGKILL);  // the ranks already started
      throw;
    }
    children[r].exit.rank = r;
  }

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<OutputPipe*> owners;
    for (auto& p : pipes)
      if (p.fd >= 0) {
        fds.push_back({p.fd, POLLIN, 0});
        owners.push_back(&p);
      }
    if (supervisor.finished(!fds.empty())) break;
    if (!fds.empty()) {
      poll(fds.data(), fds.size(), 50);
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents) drain_pipe(*owners[i], sink);
    } else {
      usleep(50 * 1000);
    }
    supervisor.round();
  }
  for (auto& p : pipes)
    if (p.fd >= 0) close(p.fd);

  for (const auto& c : children) result.ranks.push_back(c.exit);
  if (result.interrupted_by != 0) {
    conclude_interrupted(result, options, nproc, supervisor);
  } else if (supervisor.timed_out) {
    result.exit_code = kExitEnvironment;
    result.error = "run timed out after " + seconds_str(options.timeout) + ": rank(s) " +
                   join_ranks(result.failed_ranks) + " still running (hung?), stopped";
  } else if (!result.failed_ranks.empty()) {
    conclude_failed(result);
  }
  return result;
}

}  // namespace shardfit::executor
