// The project's Python and its scripts, for the commands that run one in a
// child process: `plan --model CONFIG` (pytorch/trace_recorder.py:
// launch/hf_trace_route.h) and `calibrate --stack pytorch`
// (pytorch/calibrate_stack.py: launch/calibrate.h).
#pragma once

#include <stdexcept>
#include <string>

namespace shardfit::launch {

// A Python or a script that is not where it must be: the one line why.
struct ProjectPythonMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// $SHARDFIT_PYTHON when set (a path must be an executable file); else the
// one this build's tests run (CMake's SHARDFIT_PYTHON, whose torch is the
// LibTorch shardfit links); else a .venv beside the binary's tree; else
// python3.
std::string project_python();

// pytorch/<name> beside the binary's tree, looked for as the profiles are
// (its ../pytorch, ../share/shardfit/pytorch and ../../pytorch).
std::string project_script(const std::string& name);

// libshardfit_torch.so built beside this binary, or "" (the Python scripts
// load it from $SHARDFIT_TORCH_LIB).
std::string project_torch_lib();

}  // namespace shardfit::launch
