#include "launch/hf_trace_route.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <spdlog/spdlog.h>
#include <vector>

#include "launch/child_process.h"
#include "spec/errors.h"

namespace shardfit::launch {
using spec::BadInput;

namespace {

namespace fs = std::filesystem;

std::string exe_dir() {
  const std::string exe = self_exe();
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : exe.substr(0, slash));
}

bool is_executable_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

// The route could not be taken: `why`, in one line.
struct RouteFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The Python that runs the recorder (hf_trace_route.h).
std::string tracer_python() {
  if (const char* env = std::getenv("SHARDFIT_PYTHON"); env && *env) {
    const std::string python = env;
    // A bare name is looked up on PATH when it runs; a path must be there.
    if (python.find('/') != std::string::npos && !is_executable_file(python))
      throw RouteFailure("SHARDFIT_PYTHON=" + python + " is not an executable file");
    return python;
  }
#ifdef SHARDFIT_CONFIGURED_PYTHON
  if (is_executable_file(SHARDFIT_CONFIGURED_PYTHON)) return SHARDFIT_CONFIGURED_PYTHON;
#endif
  for (const std::string& venv : {exe_dir() + "/../.venv/bin/python", exe_dir() + "/../../.venv/bin/python"})
    if (is_executable_file(venv)) return fs::weakly_canonical(venv).string();
  return "python3";
}

// The first of `relative` (to the binary's directory) that exists, or "".
std::string beside_binary(const std::vector<std::string>& relative) {
  std::error_code ec;
  for (const std::string& r : relative)
    if (fs::exists(exe_dir() + "/" + r, ec)) return fs::weakly_canonical(exe_dir() + "/" + r).string();
  return "";
}

// pytorch/trace_recorder.py, looked for as the profiles are (profile.h).
std::string recorder_script() {
  const std::vector<std::string> places = {"../pytorch/trace_recorder.py",
                                           "../share/shardfit/pytorch/trace_recorder.py",
                                           "../../pytorch/trace_recorder.py"};
  const std::string found = beside_binary(places);
  if (found.empty())
    throw RouteFailure("no pytorch/trace_recorder.py beside " + self_exe() + " (looked in its ../pytorch, "
                       "../share/shardfit/pytorch and ../../pytorch)");
  return found;
}

// The recorder's last words: the last non-empty line of its output.
std::string last_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

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

HfTraceRoute::HfTraceRoute(const models::NoBuiltinModel& no_builtin, HfTraceOptions options)
    : config_path_(no_builtin.config_path),
      model_type_(no_builtin.model_type),
      options_(std::move(options)) {}

std::shared_ptr<planner::TraceFile> HfTraceRoute::trace(int64_t seq_len, int threads) {
  if (auto it = traced_.find({seq_len, threads}); it != traced_.end()) return it->second;
  std::string python = "python";
  try {
    python = tracer_python();
    const std::string script = recorder_script();
    const TempDir dir;
    const std::string out = dir.path + "/model.trace.json", log = dir.path + "/recorder.log";
    std::vector<std::string> argv = {python, script, "--model", "hf:", "--config", config_path_, "--seq-len",
                                     std::to_string(seq_len), "--target", options_.cuda ? "cuda" : "cpu"};
    if (!options_.param_dtype.empty()) argv.insert(argv.end(), {"--param-dtype", options_.param_dtype});
    if (threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads)});
    std::string shown;  // the command as a user would type it, less the temporary --out
    for (const std::string& word : argv) shown += (shown.empty() ? "" : " ") + word;
    argv.insert(argv.end(), {"--out", out});
    const std::string torch_lib = beside_binary({"../pytorch/libshardfit_torch.so", "../lib/libshardfit_torch.so"});
    std::vector<std::pair<std::string, std::string>> env;
    if (!torch_lib.empty()) env.emplace_back("SHARDFIT_TORCH_LIB", torch_lib);
    const int status = launch::run_child(argv, log, env).status;
    if (status != 0) throw RouteFailure(failure_reason(status, python, last_line(log)));
    try {
      auto file = std::make_shared<planner::TraceFile>(planner::read_trace_file(out));
      // Said once it worked, so that a failure is the one line below.
      spdlog::info("plan: model_type '{}' has no built-in: traced {} through transformers' own class ({})",
                   model_type_, file->model_name, shown);
      traced_[{seq_len, threads}] = file;
      return file;
    } catch (const std::invalid_argument& e) {
      throw RouteFailure(std::string("its trace cannot be read: ") + e.what());
    }
  } catch (const RouteFailure& e) {
    throw BadInput(config_path_ + ": model_type '" + model_type_ +
                   "' has no built-in and tracing it through transformers' own class failed: " + e.what() +
                   "; the route: " + python + " pytorch/trace_recorder.py --model hf: --config " + config_path_ +
                   " --seq-len " + std::to_string(seq_len) +
                   " --out model.trace.json, then plan --trace model.trace.json");
  }
}

}  // namespace shardfit::launch
