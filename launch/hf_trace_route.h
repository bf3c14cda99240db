// `plan --model CONFIG` for a config.json whose model_type has no built-in
// C++ model (gemma2, phi3, mixtral, ...), and `plan --stack pytorch --model
// M` for any model (PyTorch's own step runs transformers' own class): the
// config is traced through transformers' own class by
// pytorch/trace_recorder.py --model hf:, run by the project's Python, into a
// temporary file, and planned from that trace as `plan --trace` plans it.
//
// The Python and the recorder are the project's (launch/project_python.h):
// pytorch/trace_recorder.py beside the binary's tree, as the profiles are
// found; it loads libshardfit_torch.so from $SHARDFIT_TORCH_LIB, else the
// one built beside this binary.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "models/model_config.h"
#include "planner/trace_file.h"

namespace shardfit::launch {

// What the recorder is asked besides the config and the sequence length.
struct HfTraceOptions {
  bool cuda = false;        // --target cuda (a CUDA profile's kernels), else cpu
  std::string param_dtype;  // --param-dtype bf16|fp16 (FSDP MixedPrecision candidates), or ""
  std::string name;         // --name: the model's name in the plan, or "" (the config's architecture)
  // --attention: the attention where the config names no attn_implementation,
  // or "" (the recorder's eager). `sdpa_or_eager`: sdpa there is
  // transformers' own default, not asked for: where the recorder refuses its
  // kernel (pytorch/cpu_flash_attention.py: a mask on the CPU's flash
  // kernel), the route traces eager instead and says so once.
  std::string attention;
  bool sdpa_or_eager = false;
};

class HfTraceRoute {
 public:
  // A config.json on disk; `reason` says why it is traced rather than built
  // ("model_type 'phi3' has no built-in"), in the route's messages.
  HfTraceRoute(std::string config_path, std::string reason, HfTraceOptions options);
  HfTraceRoute(const models::NoBuiltinModel& no_builtin, HfTraceOptions options);
  // A built-in model: its config as transformers reads it (`hf_config`,
  // models::to_hf_config's), written to a temporary file the route keeps;
  // its messages name `shardfit models NAME --hf-config`, which prints it.
  static std::unique_ptr<HfTraceRoute> of_builtin(const std::string& name, const std::string& hf_config,
                                                  std::string reason, HfTraceOptions options);

  // The config traced at `seq_len` (once per length and thread count), for
  // CPU ranks of `threads` intra-op threads each (the recorder's --threads;
  // 0: its own), or BadInput with one line naming the route and why it
  // could not be taken (no Python with torch and transformers, an
  // architecture transformers does not know, the recorder refusing the
  // config).
  std::shared_ptr<planner::TraceFile> trace(int64_t seq_len, int threads = 0);

 private:
  // The recorder run once: the trace, or RouteFailure.
  std::shared_ptr<planner::TraceFile> record(int64_t seq_len, int threads);

  std::string config_path_, reason_;
  std::string python_ = "python";  // the project's Python, once found
  // How the route's messages name the config: its path; for a built-in
  // "config.json", after the command that writes it (config_prefix_).
  std::string config_shown_, config_prefix_;
  HfTraceOptions options_;
  std::shared_ptr<void> config_dir_;  // a built-in's temporary config, removed with the route
  std::map<std::pair<int64_t, int>, std::shared_ptr<planner::TraceFile>> traced_;
};

}  // namespace shardfit::launch
