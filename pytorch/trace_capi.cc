// The tracer inside a Python process: a C ABI over the
// C++ tracer's own machinery (planner/trace_recorder.h: the meta-device
// recording allocator, the op observer, the CPU-imitating meta kernels),
// which pytorch/trace_recorder.py drives with ctypes. Python builds the
// model on the meta device and runs its forward and backward; its module
// hooks report where each module begins and ends; this side records every
// storage, exactly as `shardfit plan` traces a built-in model, and writes
// the traces as a shardfit.trace/1 file (planner/trace_file.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/version.h>

#include "executor/tracking_allocator.h"
#include "planner/trace_file.h"
#include "planner/trace_recorder.h"

using namespace shardfit::planner;

namespace {

// The trace being recorded: between shardfit_trace_begin and shardfit_trace_end.
struct ActiveTrace {
  ModelTrace trace;
  std::unique_ptr<TraceRecording> recording;
  int64_t outputs_from = -1, outputs_to = -1;  // event indices (shardfit_trace_outputs_dropped)
};
std::unique_ptr<ActiveTrace> g_active;
std::vector<ModelTrace> g_traces;      // finished steps, in order
std::vector<ModelTrace> g_optimizer;   // finished optimizer steps, in order
int64_t g_block_input_casts = -1;      // TraceFile::block_input_casts for the next file
bool g_active_is_optimizer = false;
std::string g_error;

int fail(const std::string& what) {
  g_error = what;
  return -1;
}

}  // namespace

extern "C" {

const char* shardfit_trace_error() { return g_error.c_str(); }

// Starts recording one forward + backward of `batch` sequences (batch 0:
// one optimizer step, kept apart). The model must already be on the meta
// device (built unrecorded). `recompute_json`: a JSON list of the module
// indices checkpointed; `grads`: "accumulate" (every .grad exists) or
// "none" (ModelTrace::grads_at_start). Returns 0, or -1 (see
// shardfit_trace_error).
int shardfit_trace_begin(const char* modules_json, int64_t batch, int64_t seq_len, const char* dtype,
                         const char* recompute_json, const char* grads, int target_cuda, int cpu_threads) {
  try {
    if (g_active) return fail("a trace is already being recorded");
    auto s = std::make_unique<ActiveTrace>();
    g_active_is_optimizer = batch == 0;
    s->trace.grads_at_start = grads == nullptr || std::string(grads) != "none";
    s->trace.modules = parse_module_table(modules_json, "the module table");
    s->trace.batch = batch;
    s->trace.seq_len = seq_len;
    const std::string d = dtype ? dtype : "fp32";
    s->trace.compute_dtype = d == "bf16" ? DType::kBF16 : d == "fp16" ? DType::kF16 : DType::kF32;
    const auto rec = nlohmann::json::parse(recompute_json ? recompute_json : "[]");
    for (const auto& m : rec) s->trace.recompute_modules.push_back(m.get<int>());
    std::sort(s->trace.recompute_modules.begin(), s->trace.recompute_modules.end());
    RecorderOptions o;
    o.record_ops = true;
    o.target_cuda = target_cuda != 0;
    if (!o.target_cuda && s->trace.compute_dtype == DType::kBF16) o.cpu_bf16_threads = cpu_threads > 0 ? cpu_threads : 1;
    o.record_host_storages = !o.target_cuda;
    // Python's torch registers decompositions as meta kernels at import; the
    // tracer's kernels allocate what the target's kernels do, so they win.
    register_meta_kernels(/*override_existing=*/true);
    s->recording = std::make_unique<TraceRecording>(&s->trace, o);
    // A CPU target: the host is the device. The meter (this library's
    // tracking allocator, installed as the CPU allocator) reports the host
    // storages the trace's kernels make: scalars wrapped as tensors.
    using shardfit::executor::TrackingAllocator;
    if (!o.target_cuda) {
      TrackingAllocator::cpu();
      TrackingAllocator::set_observer(&TraceRecording::host_storage);
    }
    s->recording->start();
    g_active = std::move(s);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

void shardfit_trace_forward_begin(int m) { TraceRecording::forward_begin(m); }
void shardfit_trace_forward_end(int m) { TraceRecording::forward_end(m); }
void shardfit_trace_backward_begin(int m) { TraceRecording::backward_begin(m); }
void shardfit_trace_backward_end(int m) { TraceRecording::backward_end(m); }
void shardfit_trace_recompute_begin(int m) { TraceRecording::recompute_begin(m); }
void shardfit_trace_recompute_end(int m) { TraceRecording::recompute_end(m); }
void shardfit_trace_backward_phase() { TraceRecording::begin_backward_phase(); }

// The trace begun last checkpoints its recomputed modules with
// use_reentrant=True (ModelTrace::recompute_reentrant).
int shardfit_trace_reentrant() {
  if (!g_active) return fail("no trace is being recorded");
  g_active->trace.recompute_reentrant = true;
  return 0;
}

// The trace begun last ran its forward under torch.autocast of its dtype
// (ModelTrace::autocast).
int shardfit_trace_autocast() {
  if (!g_active) return fail("no trace is being recorded");
  if (g_active->trace.compute_dtype == DType::kF32) return fail("autocast needs a bf16 or fp16 trace");
  g_active->trace.autocast = true;
  return 0;
}

// Forgets every trace recorded under autocast (the recorder's, when the
// model cannot run under it).
int shardfit_trace_forget_autocast() {
  g_traces.erase(std::remove_if(g_traces.begin(), g_traces.end(), [](const ModelTrace& t) { return t.autocast; }),
                 g_traces.end());
  return 0;
}

// The floating block inputs that FSDP2's per-block casts converted while
// the cast model's traces were recorded (TraceFile::block_input_casts), for
// the next file written.
int shardfit_trace_block_input_casts(int64_t n) {
  g_block_input_casts = n;
  return 0;
}

// Brackets the recorder dropping what the forward returned beside the loss:
// the storages freed in between are the outputs a training loop keeps
// (ModelTrace::kept_outputs); their frees are left out of the trace.
int shardfit_trace_outputs_dropped(int begin) {
  if (!g_active) return fail("no trace is being recorded");
  (begin ? g_active->outputs_from : g_active->outputs_to) = static_cast<int64_t>(g_active->trace.events.size());
  return 0;
}

// The bytes of each tensor with a grad_fn the forward of the trace begun last
// returned (ModelTrace::output_tensor_bytes): a JSON list.
int shardfit_trace_output_tensors(const char* bytes_json) {
  if (!g_active) return fail("no trace is being recorded");
  try {
    for (const auto& b : nlohmann::json::parse(bytes_json ? bytes_json : "[]"))
      g_active->trace.output_tensor_bytes.push_back(b.get<int64_t>());
  } catch (const std::exception& e) {
    return fail(std::string("output tensors: ") + e.what());
  }
  return 0;
}

// Ends the trace begun last (closing the backward of modules whose inputs
// need no gradient) and keeps it for shardfit_trace_write.
int shardfit_trace_end() {
  if (!g_active) return fail("no trace is being recorded");
  TraceRecording::end_open_backwards();
  shardfit::executor::TrackingAllocator::set_observer(nullptr);
  g_active->recording.reset();
  ModelTrace t = std::move(g_active->trace);
  t.modules.clear();  // the file's
  if (g_active->outputs_from >= 0 && g_active->outputs_to >= g_active->outputs_from) {
    std::vector<MemEvent> events;
    for (int64_t i = 0; i < static_cast<int64_t>(t.events.size()); ++i) {
      const MemEvent& e = t.events[i];
      if (i >= g_active->outputs_from && i < g_active->outputs_to && e.kind == MemEvent::kFree)
        t.kept_outputs.push_back(e.tensor);
      else
        events.push_back(e);
    }
    t.events = std::move(events);
  }
  (g_active_is_optimizer ? g_optimizer : g_traces).push_back(std::move(t));
  g_active.reset();
  return 0;
}

// Peak bytes of the last finished trace (or optimizer step, if that was last)'s storages (what replaying its
// events reaches), for checks against a measurement.
int64_t shardfit_trace_last_peak() {
  const auto& list = g_active_is_optimizer ? g_optimizer : g_traces;
  if (list.empty()) return -1;
  int64_t live = 0, peak = 0;
  std::unordered_map<int64_t, int64_t> sizes;
  for (const auto& e : list.back().events) {
    if (e.kind == MemEvent::kAlloc) {
      sizes[e.tensor] = e.bytes;
      peak = std::max(peak, live += e.bytes);
    } else if (e.kind == MemEvent::kFree) {
      live -= sizes[e.tensor];
    }
  }
  return peak;
}

// Writes every finished trace as one shardfit.trace/1 file and forgets them.
int shardfit_trace_write(const char* path, const char* name, const char* factory, const char* input,
                         int64_t seq_len, const char* modules_json, int target_cuda, const char* optimizer) {
  try {
    TraceFile f;
    f.model_name = name;
    f.factory = factory;
    f.input = input;
    f.seq_len = seq_len;
    f.target_cuda = target_cuda != 0;
    f.torch_version = TORCH_VERSION;  // this library's LibTorch, the one the recording process runs
    f.block_input_casts = g_block_input_casts;
    g_block_input_casts = -1;
    f.modules = parse_module_table(modules_json, "the module table");
    f.traces = std::move(g_traces);
    g_traces.clear();
    if (!g_optimizer.empty()) {
      // Recorded in order (pytorch/trace_optimizer.py): the optimizer's two
      // steps over every parameter, its zero_grad, then two steps per
      // parameter alone, then two steps of the foreach=True optimizer, then
      // two of the fused=True one.
      f.optimizer = optimizer ? optimizer : "";
      const size_t n = g_optimizer.size(), per_param = 2 * f.param_numels().size();
      if (n < 3 || (n != 3 && n != 3 + per_param && n != 3 + per_param + 2 && n != 3 + per_param + 4))
        return fail("the optimizer's traces are not 3 (two steps, zero_grad), nor 3 + 2 per parameter (+ 2 "
                    "foreach steps, + 2 fused steps)");
      f.optimizer_steps.assign(g_optimizer.begin(), g_optimizer.begin() + 2);
      f.optimizer_zero_grad = g_optimizer[2];
      auto at = [&](size_t i) { return g_optimizer.begin() + static_cast<std::ptrdiff_t>(std::min(n, i)); };
      f.optimizer_param_steps.assign(at(3), at(3 + per_param));
      f.optimizer_foreach_steps.assign(at(3 + per_param), at(5 + per_param));
      f.optimizer_fused_steps.assign(at(5 + per_param), at(7 + per_param));
    }
    g_optimizer.clear();
    const std::string text = trace_file_json(f);
    parse_trace_file(text, path);  // what plan --trace will accept, checked before it is written
    FILE* out = std::fopen(path, "wb");
    if (!out) return fail(std::string("cannot write ") + path);
    const bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
    if (std::fclose(out) != 0 || !ok) return fail(std::string("cannot write ") + path);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

}  // extern "C"
