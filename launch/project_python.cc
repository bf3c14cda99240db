#include "launch/project_python.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "launch/child_process.h"

namespace shardfit::launch {
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

// The first of `relative` (to the binary's directory) that exists, or "".
std::string beside_binary(const std::vector<std::string>& relative) {
  std::error_code ec;
  for (const std::string& r : relative)
    if (fs::exists(exe_dir() + "/" + r, ec)) return fs::weakly_canonical(exe_dir() + "/" + r).string();
  return "";
}

}  // namespace

std::string project_python() {
  if (const char* env = std::getenv("SHARDFIT_PYTHON"); env && *env) {
    const std::string python = env;
    // A bare name is looked up on PATH when it runs; a path must be there.
    if (python.find('/') != std::string::npos && !is_executable_file(python))
      throw ProjectPythonMissing("SHARDFIT_PYTHON=" + python + " is not an executable file");
    return python;
  }
#ifdef SHARDFIT_CONFIGURED_PYTHON
  if (is_executable_file(SHARDFIT_CONFIGURED_PYTHON)) return SHARDFIT_CONFIGURED_PYTHON;
#endif
  for (const std::string& venv : {exe_dir() + "/../.venv/bin/python", exe_dir() + "/../../.venv/bin/python"})
    if (is_executable_file(venv)) return fs::weakly_canonical(venv).string();
  return "python3";
}

std::string project_script(const std::string& name) {
  const std::string found =
      beside_binary({"../pytorch/" + name, "../share/shardfit/pytorch/" + name, "../../pytorch/" + name});
  if (found.empty())
    throw ProjectPythonMissing("no pytorch/" + name + " beside " + self_exe() +
                               " (looked in its ../pytorch, ../share/shardfit/pytorch and ../../pytorch)");
  return found;
}

std::string project_torch_lib() {
  return beside_binary({"../pytorch/libshardfit_torch.so", "../lib/libshardfit_torch.so"});
}

}  // namespace shardfit::launch
