#include "planner/trace_recorder.h"

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>

#include "planner/meta_recording_allocator.h"

namespace shardfit::planner {

// meta_kernels.cc
std::vector<int64_t> cpu_bf16_matmul_temporaries(const char* op, c10::ArrayRef<const c10::IValue> inputs,
                                                 int threads);

namespace {

std::mutex g_trace_mu;  // one recording at a time (trace_recorder.h)

struct Recorder {
  bool active = false;
  ModelTrace* trace = nullptr;
  Phase phase = Phase::kForward;
  std::vector<int> forward_stack;   // modules running forward (or recompute)
  std::vector<int> backward_stack;  // modules whose backward has begun, not ended
  std::vector<int> op_stack;        // ops running (indices into op_names)
  std::unordered_map<std::string, int> op_index;
  std::unordered_map<const void*, int64_t> host_ids;  // live host storages recorded
  int64_t next_tensor = 1;
  bool record_ops = false;
  // > 0: record what the CPU's bf16 matrix products allocate besides their
  // outputs (meta_kernels.cc), oneDNN scratchpads sized for this many
  // threads (TraceOptions::cpu_threads).
  int cpu_bf16_threads = 0;

  int current_module() const {
    if (phase == Phase::kBackward && !backward_stack.empty()) return backward_stack.back();
    if (phase != Phase::kBackward && !forward_stack.empty()) return forward_stack.back();
    return 0;
  }
  void push(MemEvent::Kind kind, int module, int64_t tensor = -1, int64_t bytes = 0) {
    MemEvent e;
    e.kind = kind;
    e.phase = phase;
    e.module = module;
    e.tensor = tensor;
    e.bytes = bytes;
    e.op = op_stack.empty() ? -1 : op_stack.back();
    trace->events.push_back(e);
  }
  int intern_op(const char* name) {
    auto it = op_index.find(name);
    if (it != op_index.end()) return it->second;
    const int idx = static_cast<int>(trace->op_names.size());
    trace->op_names.emplace_back(name);
    op_index.emplace(name, idx);
    return idx;
  }
};
Recorder g_rec;

}  // namespace

// kMeta's allocator while shardfit runs (planner/meta_recording_allocator.h).
c10::DataPtr MetaRecordingAllocator::allocate_recorded(size_t nbytes) const {
  void* ctx = nullptr;
  if (g_rec.active) {
    const int64_t id = g_rec.next_tensor++;
    g_rec.push(MemEvent::kAlloc, g_rec.current_module(), id, static_cast<int64_t>(nbytes));
    ctx = reinterpret_cast<void*>(static_cast<intptr_t>(id));
  }
  return {nullptr, ctx, &MetaRecordingAllocator::release, c10::Device(c10::DeviceType::Meta)};
}

void MetaRecordingAllocator::release(void* ctx) {
  if (ctx == nullptr || !g_rec.active) return;
  g_rec.push(MemEvent::kFree, g_rec.current_module(), static_cast<int64_t>(reinterpret_cast<intptr_t>(ctx)));
}

namespace {

void install_meta_allocator() {
  static MetaRecordingAllocator* alloc = [] {
    auto* a = new MetaRecordingAllocator();
    c10::SetAllocator(c10::DeviceType::Meta, a, /*priority=*/100);
    return a;
  }();
  (void)alloc;
}

int64_t dim_product(const c10::IValue& v, int64_t from, int64_t to) {
  if (!v.isTensor()) return 0;
  const auto sizes = v.toTensor().sizes();
  int64_t p = 1;
  for (int64_t i = from; i < to && i < static_cast<int64_t>(sizes.size()); ++i) p *= sizes[i];
  return p;
}

// 2·m·n·k for the matmul-like leaf ops every linear layer and attention
// product ends in.
double matmul_flops(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  auto in = fn.inputs();
  auto shape = [&](size_t i) { return in[i].toTensor().sizes(); };
  if (name == "aten::mm" && in.size() >= 2 && in[0].isTensor() && in[1].isTensor())
    return 2.0 * shape(0)[0] * shape(0)[1] * shape(1)[1];
  if (name == "aten::addmm" && in.size() >= 3 && in[1].isTensor() && in[2].isTensor())
    return 2.0 * shape(1)[0] * shape(1)[1] * shape(2)[1];
  if (name == "aten::bmm" && in.size() >= 2 && in[0].isTensor() && in[1].isTensor())
    return 2.0 * dim_product(in[0], 0, 3) * shape(1)[2];
  if (name == "aten::baddbmm" && in.size() >= 3 && in[1].isTensor() && in[2].isTensor())
    return 2.0 * dim_product(in[1], 0, 3) * shape(2)[2];
  return 0.0;
}

// Storages a real kernel allocates inside an op besides its outputs, which
// its meta kernel cannot show: sized when the op starts (its inputs are only
// readable then), recorded when it ends, after the outputs, as the real
// kernel allocates them. All are freed before the op returns.
struct KernelTemporaries final : at::ObserverContext {
  std::vector<int64_t> bytes;  // in allocation order
};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (!g_rec.active) return nullptr;
  if (g_rec.record_ops) {
    g_rec.op_stack.push_back(g_rec.intern_op(fn.name()));
    if (fn.scope() == at::RecordScope::FUNCTION) {
      const double f = matmul_flops(fn);
      if (g_rec.phase == Phase::kForward)
        g_rec.trace->forward_flops += f;
      else
        g_rec.trace->backward_flops += f;
    }
  }
  if (g_rec.cpu_bf16_threads > 0 && fn.scope() == at::RecordScope::FUNCTION) {
    std::vector<int64_t> bytes = cpu_bf16_matmul_temporaries(fn.name(), fn.inputs(), g_rec.cpu_bf16_threads);
    if (!bytes.empty()) {
      auto t = std::make_unique<KernelTemporaries>();
      t->bytes = std::move(bytes);
      return t;
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (!g_rec.active) return;
  if (auto* t = static_cast<KernelTemporaries*>(ctx)) {
    std::vector<int64_t> ids;
    for (int64_t bytes : t->bytes) {
      ids.push_back(g_rec.next_tensor++);
      g_rec.push(MemEvent::kAlloc, g_rec.current_module(), ids.back(), bytes);
    }
    for (auto id = ids.rbegin(); id != ids.rend(); ++id) g_rec.push(MemEvent::kFree, g_rec.current_module(), *id);
  }
  if (g_rec.record_ops && !g_rec.op_stack.empty()) g_rec.op_stack.pop_back();
}

}  // namespace


TraceRecording::TraceRecording(ModelTrace* trace, const RecorderOptions& o) : lock_(g_trace_mu) {
  register_meta_kernels(/*override_existing=*/false);
  install_meta_allocator();
  set_meta_kernels_target_cuda(o.target_cuda);
  g_rec = Recorder{};
  g_rec.trace = trace;
  g_rec.record_ops = o.record_ops;
  g_rec.cpu_bf16_threads = o.cpu_bf16_threads;
  if (g_rec.record_ops || g_rec.cpu_bf16_threads > 0) {
    const at::CallbackHandle h = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    handle_ = reinterpret_cast<void*>(static_cast<uintptr_t>(h));
  }
}

void TraceRecording::start() { g_rec.active = true; }

TraceRecording::~TraceRecording() {
  g_rec.active = false;
  if (handle_) at::removeCallback(static_cast<at::CallbackHandle>(reinterpret_cast<uintptr_t>(handle_)));
  g_rec.trace = nullptr;
}

void TraceRecording::forward_begin(int m) {
  g_rec.push(MemEvent::kModuleBegin, m);
  g_rec.forward_stack.push_back(m);
}

void TraceRecording::forward_end(int m) {
  if (!g_rec.forward_stack.empty()) g_rec.forward_stack.pop_back();
  g_rec.push(MemEvent::kModuleEnd, m);
}

void TraceRecording::begin_backward_phase() { g_rec.phase = Phase::kBackward; }

void TraceRecording::backward_begin(int m) {
  g_rec.phase = Phase::kBackward;
  g_rec.push(MemEvent::kModuleBegin, m);
  g_rec.backward_stack.push_back(m);
}

void TraceRecording::backward_end(int m) {
  auto& st = g_rec.backward_stack;
  for (auto it = st.rbegin(); it != st.rend(); ++it) {
    if (*it == m) {
      st.erase(std::next(it).base());
      break;
    }
  }
  g_rec.push(MemEvent::kModuleEnd, m);
}

void TraceRecording::recompute_begin(int m) {
  g_rec.phase = Phase::kRecompute;
  forward_begin(m);
}

void TraceRecording::recompute_end(int m) {
  forward_end(m);
  g_rec.phase = Phase::kBackward;
}

void TraceRecording::host_storage(const void* data, int64_t bytes) {
  if (!g_rec.active) return;
  if (bytes > 0) {
    const int64_t id = g_rec.next_tensor++;
    g_rec.host_ids[data] = id;
    g_rec.push(MemEvent::kAlloc, g_rec.current_module(), id, bytes);
  } else if (auto it = g_rec.host_ids.find(data); it != g_rec.host_ids.end()) {
    g_rec.push(MemEvent::kFree, g_rec.current_module(), it->second);
    g_rec.host_ids.erase(it);
  }
}

void TraceRecording::end_open_backwards() {
  while (!g_rec.backward_stack.empty()) backward_end(g_rec.backward_stack.back());
}

}  // namespace shardfit::planner
