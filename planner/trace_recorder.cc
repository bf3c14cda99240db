#include "planner/trace_recorder.h"

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>

#include "planner/meta_recording_allocator.h"

namespace shardfit::planner {

// meta_kernels.cc
std::vector<int64_t> cpu_bf16_matmul_temporaries(const char* op, c10::ArrayRef<const c10::IValue> inputs,
                                                 int threads);

namespace {

}  // namespace

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
  bool record_host_storages = false;  // RecorderOptions::record_host_storages

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

namespace {

// The recording this thread runs, if any (trace_recorder.h).
thread_local Recorder* t_rec = nullptr;

}  // namespace

// kMeta's allocator while shardfit runs (planner/meta_recording_allocator.h).
c10::DataPtr MetaRecordingAllocator::allocate_recorded(size_t nbytes) const {
  void* ctx = nullptr;
  if (Recorder* rec = t_rec; rec && rec->active) {
    const int64_t id = rec->next_tensor++;
    rec->push(MemEvent::kAlloc, rec->current_module(), id, static_cast<int64_t>(nbytes));
    ctx = reinterpret_cast<void*>(static_cast<intptr_t>(id));
  }
  return {nullptr, ctx, &MetaRecordingAllocator::release, c10::Device(c10::DeviceType::Meta)};
}

void MetaRecordingAllocator::release(void* ctx) {
  Recorder* rec = t_rec;
  if (ctx == nullptr || !rec || !rec->active) return;
  rec->push(MemEvent::kFree, rec->current_module(), static_cast<int64_t>(reinterpret_cast<intptr_t>(ctx)));
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

// A Python number given to a binary op arrives as a 0-dim CPU tensor of
// double or int64 (a "wrapped number"). On the CPU, TensorIterator then
// promotes inputs to the common dtype by making cast temporaries
// (TensorIteratorBase::compute_types, aten/src/ATen/TensorIterator.cpp: "Promotes
// inputs by creating temporaries of the correct dtype", done only when the
// common device is the CPU), so the number is copied into one element of
// the tensor's dtype for the length of the op. On the meta device no cast
// is made. Measured inside PyTorch: AdamW's `exp_avg_sq.sqrt() / c` peaks
// 4 bytes above its meta trace in fp32, exactly this. Floating tensors
// only (an integer tensor with a float number promotes the tensor too: not
// modelled).
int64_t wrapped_number_cast_bytes(const at::RecordFunction& fn) {
  static const std::unordered_set<std::string> kBinary = {
      "aten::add",  "aten::add_",  "aten::sub",     "aten::sub_",      "aten::mul",     "aten::mul_",
      "aten::div",  "aten::div_",  "aten::rsub",    "aten::addcdiv",   "aten::addcdiv_", "aten::addcmul",
      "aten::addcmul_", "aten::pow", "aten::pow_",  "aten::remainder", "aten::maximum", "aten::minimum",
      "aten::lerp", "aten::lerp_", "aten::eq",      "aten::ne",        "aten::lt",      "aten::le",
      "aten::gt",   "aten::ge"};
  if (kBinary.count(fn.name()) == 0) return 0;
  const c10::TensorImpl* number = nullptr;
  c10::ScalarType common = c10::ScalarType::Undefined;
  for (const auto& v : fn.inputs()) {
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) continue;
    if (t.unsafeGetTensorImpl()->is_wrapped_number())
      number = t.unsafeGetTensorImpl();
    else if (common == c10::ScalarType::Undefined)
      common = t.scalar_type();
  }
  if (!number || !c10::isFloatingType(common) || number->dtype() == c10::scalarTypeToTypeMeta(common)) return 0;
  return static_cast<int64_t>(c10::elementSize(common));
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  Recorder* rec = t_rec;
  if (!rec || !rec->active) return nullptr;
  Recorder& r = *rec;
  if (r.record_ops) {
    r.op_stack.push_back(r.intern_op(fn.name()));
    if (fn.scope() == at::RecordScope::FUNCTION) {
      const double f = matmul_flops(fn);
      if (r.phase == Phase::kForward)
        r.trace->forward_flops += f;
      else
        r.trace->backward_flops += f;
    }
  }
  if (r.record_host_storages && fn.scope() == at::RecordScope::FUNCTION) {
    if (const int64_t cast = wrapped_number_cast_bytes(fn)) {
      auto t = std::make_unique<KernelTemporaries>();
      t->bytes = {cast};
      return t;
    }
  }
  if (r.cpu_bf16_threads > 0 && fn.scope() == at::RecordScope::FUNCTION) {
    std::vector<int64_t> bytes = cpu_bf16_matmul_temporaries(fn.name(), fn.inputs(), r.cpu_bf16_threads);
    if (!bytes.empty()) {
      auto t = std::make_unique<KernelTemporaries>();
      t->bytes = std::move(bytes);
      return t;
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  Recorder* rec = t_rec;
  if (!rec || !rec->active) return;
  Recorder& r = *rec;
  if (auto* t = static_cast<KernelTemporaries*>(ctx)) {
    std::vector<int64_t> ids;
    for (int64_t bytes : t->bytes) {
      ids.push_back(r.next_tensor++);
      r.push(MemEvent::kAlloc, r.current_module(), ids.back(), bytes);
    }
    for (auto id = ids.rbegin(); id != ids.rend(); ++id) r.push(MemEvent::kFree, r.current_module(), *id);
  }
  if (r.record_ops && !r.op_stack.empty()) r.op_stack.pop_back();
}

}  // namespace


TraceRecording::TraceRecording(ModelTrace* trace, const RecorderOptions& o) : rec_(std::make_unique<Recorder>()) {
  if (t_rec) throw std::logic_error("a trace is already being recorded on this thread");
  register_meta_kernels(/*override_existing=*/false);
  install_meta_allocator();
  set_meta_kernels_target_cuda(o.target_cuda);
  Recorder& r = *rec_;
  r.trace = trace;
  r.record_ops = o.record_ops;
  r.cpu_bf16_threads = o.cpu_bf16_threads;
  r.record_host_storages = o.record_host_storages && !o.target_cuda;
  if (r.record_ops || r.cpu_bf16_threads > 0 || r.record_host_storages) {
    // This thread's ops only: a recording on another thread has its own.
    const at::CallbackHandle h = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    handle_ = reinterpret_cast<void*>(static_cast<uintptr_t>(h));
  }
  t_rec = rec_.get();
}

void TraceRecording::start() { rec_->active = true; }

TraceRecording::~TraceRecording() {
  rec_->active = false;
  if (handle_) at::removeCallback(static_cast<at::CallbackHandle>(reinterpret_cast<uintptr_t>(handle_)));
  t_rec = nullptr;
}

// The calls below come from the thread recording (its module runner and
// autograd callbacks); on a thread that records nothing they do nothing.
void TraceRecording::forward_begin(int m) {
  if (!t_rec) return;
  t_rec->push(MemEvent::kModuleBegin, m);
  t_rec->forward_stack.push_back(m);
}

void TraceRecording::forward_end(int m) {
  if (!t_rec) return;
  if (!t_rec->forward_stack.empty()) t_rec->forward_stack.pop_back();
  t_rec->push(MemEvent::kModuleEnd, m);
}

void TraceRecording::begin_backward_phase() {
  if (t_rec) t_rec->phase = Phase::kBackward;
}

void TraceRecording::backward_begin(int m) {
  if (!t_rec) return;
  t_rec->phase = Phase::kBackward;
  t_rec->push(MemEvent::kModuleBegin, m);
  t_rec->backward_stack.push_back(m);
}

void TraceRecording::backward_end(int m) {
  if (!t_rec) return;
  auto& st = t_rec->backward_stack;
  for (auto it = st.rbegin(); it != st.rend(); ++it) {
    if (*it == m) {
      st.erase(std::next(it).base());
      break;
    }
  }
  t_rec->push(MemEvent::kModuleEnd, m);
}

void TraceRecording::recompute_begin(int m) {
  if (!t_rec) return;
  t_rec->phase = Phase::kRecompute;
  forward_begin(m);
}

void TraceRecording::recompute_end(int m) {
  if (!t_rec) return;
  forward_end(m);
  t_rec->phase = Phase::kBackward;
}

void TraceRecording::host_storage(const void* data, int64_t bytes) {
  Recorder* r = t_rec;
  if (!r || !r->active) return;
  if (bytes > 0) {
    const int64_t id = r->next_tensor++;
    r->host_ids[data] = id;
    r->push(MemEvent::kAlloc, r->current_module(), id, bytes);
  } else if (auto it = r->host_ids.find(data); it != r->host_ids.end()) {
    r->push(MemEvent::kFree, r->current_module(), it->second);
    r->host_ids.erase(it);
  }
}

void TraceRecording::end_open_backwards() {
  if (!t_rec) return;
  while (!t_rec->backward_stack.empty()) backward_end(t_rec->backward_stack.back());
}

}  // namespace shardfit::planner
