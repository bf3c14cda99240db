#include "launch/hf_trace_route.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <spdlog/spdlog.h>
#include <vector>

#include "launch/child_process.h"
#include "launch/project_python.h"
#include "spec/errors.h"

namespace shardfit::launch {
using spec::BadInput;

namespace {

namespace fs = std::filesystem;

// The route could not be taken: `why`, in one line.
struct RouteFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Why the recorder's run failed, from its status and last line.
std::string failure_reason(int status, const std::string& python, const std::string& last) {
  if (status == 127 && last.empty()) return "cannot run " + python;
  if (last.find("No module named") != std::string::npos)
    return python + " cannot import torch and transformers (" + last + ")";
  std::string why = last.empty() ? "no output" : last;
  if (why.rfind("trace_recorder: ", 0) == 0) why = why.substr(16);
  return "the recorder exited " + std::to_string(status) + ": " + why;
}

// A private temporary directory, removed with this object.
struct TempDir {
  std::string path;
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/shardfit-hf-trace-XXXXXX";
    if (!mkdtemp(pattern.data())) throw RouteFailure("cannot make a temporary directory (" + pattern + ")");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

HfTraceRoute::HfTraceRoute(std::string config_path, std::string reason, HfTraceOptions options)
    : config_path_(std::move(config_path)),
      reason_(std::move(reason)),
      config_shown_(config_path_),
      options_(std::move(options)) {}

HfTraceRoute::HfTraceRoute(const models::NoBuiltinModel& no_builtin, HfTraceOptions options)
    : HfTraceRoute(no_builtin.config_path, "model_type '" + no_builtin.model_type + "' has no built-in",
                   std::move(options)) {}

std::unique_ptr<HfTraceRoute> HfTraceRoute::of_builtin(const std::string& name, const std::string& hf_config,
                                                       std::string reason, HfTraceOptions options) {
  std::shared_ptr<TempDir> dir;
  try {
    dir = std::make_shared<TempDir>();
  } catch (const RouteFailure& e) {
    throw std::runtime_error(std::string("plan: ") + e.what());
  }
  const std::string path = dir->path + "/config.json";
  std::ofstream(path) << hf_config << "\n";
  auto route = std::make_unique<HfTraceRoute>(path, std::move(reason), std::move(options));
  route->config_shown_ = "config.json";
  route->config_prefix_ = "shardfit models " + name + " --hf-config > config.json; ";
  route->config_dir_ = dir;
  return route;
}

std::shared_ptr<planner::TraceFile> HfTraceRoute::trace(int64_t seq_len, int threads) {
  if (auto it = traced_.find({seq_len, threads}); it != traced_.end()) return it->second;
  const std::string named = options_.name.empty() ? config_path_ : options_.name;
  try {
    try {
      return traced_[{seq_len, threads}] = record(seq_len, threads);
    } catch (const RouteFailure& e) {
      // The recorder's refusal of the kernel, from its own words on.
      std::string why = e.what();
      const size_t at = why.find("scaled_dot_product_attention");
      if (!options_.sdpa_or_eager || at == std::string::npos) throw;
      why = why.substr(at);
      while (!why.empty() && why.back() == ')' && std::count(why.begin(), why.end(), ')') >
                                                      std::count(why.begin(), why.end(), '('))
        why.pop_back();
      // Every later length is traced in eager too: one attention per plan.
      spdlog::warn("plan: {}: transformers runs sdpa where the config names no attn_implementation, and the trace "
                   "cannot follow its kernel here ({}); traced in eager instead: set attn_implementation eager to "
                   "run what is planned",
                   named, why);
      options_.attention = "eager";
      options_.sdpa_or_eager = false;
      return traced_[{seq_len, threads}] = record(seq_len, threads);
    }
  } catch (const RouteFailure& e) {
    const std::string attention = options_.attention.empty() ? "" : " --attention " + options_.attention;
    throw BadInput(named + ": " + reason_ + " and tracing it through transformers' own class failed: " + e.what() +
                   "; the route: " + config_prefix_ + python_ + " pytorch/trace_recorder.py --model hf: --config " +
                   config_shown_ + attention + " --seq-len " + std::to_string(seq_len) +
                   " --out model.trace.json, then plan --trace model.trace.json");
  }
}

std::shared_ptr<planner::TraceFile> HfTraceRoute::record(int64_t seq_len, int threads) {
  std::string script;
  try {
    python_ = project_python();
    script = project_script("trace_recorder.py");
  } catch (const ProjectPythonMissing& e) {
    throw RouteFailure(e.what());
  }
  const TempDir dir;
  const std::string out = dir.path + "/model.trace.json", log = dir.path + "/recorder.log";
  std::vector<std::string> argv = {python_, script, "--model", "hf:", "--config", config_path_};
  if (!options_.attention.empty()) argv.insert(argv.end(), {"--attention", options_.attention});
  argv.insert(argv.end(), {"--seq-len", std::to_string(seq_len), "--target", options_.cuda ? "cuda" : "cpu"});
  if (!options_.name.empty()) argv.insert(argv.end(), {"--name", options_.name});
  if (!options_.param_dtype.empty()) argv.insert(argv.end(), {"--param-dtype", options_.param_dtype});
  if (threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads)});
  // The command as a user would type it, less the temporary --out.
  std::string shown = config_prefix_;
  for (size_t i = 0; i < argv.size(); ++i)
    shown += (i ? " " : "") + (argv[i] == config_path_ ? config_shown_ : argv[i]);
  argv.insert(argv.end(), {"--out", out});
  const std::string torch_lib = project_torch_lib();
  std::vector<std::pair<std::string, std::string>> env;
  if (!torch_lib.empty()) env.emplace_back("SHARDFIT_TORCH_LIB", torch_lib);
  const int status = launch::run_child(argv, log, env).status;
  if (status != 0) throw RouteFailure(failure_reason(status, python_, last_line(log)));
  try {
    auto file = std::make_shared<planner::TraceFile>(planner::read_trace_file(out));
    // Said once it worked, so that a failure is the one line of trace().
    spdlog::info("plan: {}: traced {} through transformers' own class ({})", reason_, file->model_name, shown);
    return file;
  } catch (const std::invalid_argument& e) {
    throw RouteFailure(std::string("its trace cannot be read: ") + e.what());
  }
}

}  // namespace shardfit::launch
