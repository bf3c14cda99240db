// shardfit.trace/1: a model's traces written to a file, so a model that
// shardfit cannot build (one written in Python, traced in its own process by
// pytorch/trace_recorder.py) is planned exactly as a built-in is:
// `shardfit plan --trace FILE`. docs/trace-file.md documents the schema.
//
// A file holds one model's module table and one or more ModelTraces of it at
// one sequence length: batches 1, 2 and 3 (the planner's exact batch-1 trace
// and its affine extension beyond), per compute type and per set of
// recomputed modules. LibTorch-free: the reader is fuzzed with the others.
#pragma once

#include <string>
#include <vector>

#include "planner/model_trace.h"

namespace shardfit::planner {

inline constexpr const char* kTraceSchema = "shardfit.trace/1";

struct TraceFile {
  std::string model_name;
  std::string factory;  // what built it, e.g. "models:gpt2" (informative)
  std::string input;    // what made its inputs (informative)
  int64_t seq_len = 0;
  bool target_cuda = false;  // whose kernels the meta kernels imitated
  // The PyTorch whose operators were traced (its LibTorch's TORCH_VERSION,
  // e.g. "2.11.0"); empty in files written before it was recorded.
  std::string torch_version;
  // The traces of the model cast to bf16 on a CPU target are recorded with
  // FSDP2's per-block input casts (MixedPrecisionPolicy's
  // cast_forward_inputs): how many floating block inputs they converted.
  // 0: none, so the same traces are FSDP1's MixedPrecision, which casts the
  // root's inputs only. -1: not recorded (no such traces, a CUDA target,
  // whose cast traces are FSDP1's, or a file from before 2026-12-06).
  int64_t block_input_casts = -1;
  std::vector<ModuleNode> modules;
  std::vector<ModelTrace> traces;  // each with modules left empty (they are the file's)
  // The optimizer's own steps, traced on the model's parameters (all of
  // them, in parameters() order) with their gradients present: [0] the first
  // step (lazily created state), [1] a later one. Empty when not recorded.
  std::string optimizer;  // what was traced, e.g. "torch.optim.AdamW(foreach=False)"
  std::vector<ModelTrace> optimizer_steps;
  // Its zero_grad(set_to_none=True): what it allocates itself (the
  // gradients it drops are not in it). No events when not recorded.
  ModelTrace optimizer_zero_grad;
  // The same two steps of an optimizer holding one parameter alone, for
  // every parameter in parameters() order (the module table's): [2i] its
  // first step, [2i + 1] a later one. What a partition of the parameters
  // allocates (ZeroRedundancyOptimizer's local optimizer) is composed from
  // them. Empty when not recorded.
  std::vector<ModelTrace> optimizer_param_steps;
  // The same optimizer built with foreach=True over every parameter
  // (torch.optim.AdamW's multi-tensor step: each temporary made for all
  // parameters at once): [0] its first step, [1] a later one. Empty when not
  // recorded (files from before 2026-12-03).
  std::vector<ModelTrace> optimizer_foreach_steps;
  // The same with fused=True (one _fused_adamw_ kernel over every
  // parameter; its step counts on the parameters' device): [0] the first
  // step, [1] a later one. Empty when not recorded (PyTorch 1.13's
  // recordings, and files from before 2026-12-05).
  std::vector<ModelTrace> optimizer_fused_steps;
  // Every parameter's element count, in the module table's order.
  std::vector<int64_t> param_numels() const;

  int64_t param_count() const;
  // Every module buffer, in named_buffers() order (the module table's).
  std::vector<BufferInfo> buffers() const;
  // The trace at (dtype, recompute, batch, grads at start, checkpoint kind,
  // autocast); nullptr when the file has none.
  const ModelTrace* find(DType dtype, const std::vector<int>& recompute, int64_t batch,
                         bool grads_at_start = true, bool reentrant = false, bool autocast = false) const;
  // The recompute sets the file has traces for (sorted module indices).
  std::vector<std::vector<int>> recompute_sets() const;
  // The dtypes of the traces not under autocast (a model held in them).
  std::vector<DType> dtypes() const;
  // The type of the modules marked as blocks (the recorder's block_class),
  // "" when none is.
  std::string block_class() const;
};

// The file's JSON text.
std::string trace_file_json(const TraceFile& f);
// Parses `text`; `origin` names it in errors. Throws std::invalid_argument
// naming the field for anything malformed: another schema version, an event
// naming a module or op the file lacks, a free of a storage not live.
TraceFile parse_trace_file(const std::string& text, const std::string& origin);
// Reads and parses the file at `path` (std::invalid_argument when it cannot
// be read).
TraceFile read_trace_file(const std::string& path);

// The module table as the file writes it (also what the Python recorder
// hands the C++ side).
std::vector<ModuleNode> parse_module_table(const std::string& json_text, const std::string& origin);

const char* dtype_name(DType d);

}  // namespace shardfit::planner
