#include "planner/trace_recorder.h"

#include <algorithm>
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
  // Beside op_stack, what the time model's PhaseWork needs of each op.
  struct OpFrame {
    int kernel = -1;            // an aten op that is not a matrix product nor a view: its op_names index
    PhaseWork* work = nullptr;  // the phase it started in
    bool has_child = false;  // another op ran inside it: not a leaf
    double input_bytes = 0;
    int64_t allocated_at_start = 0;
  };
  std::vector<OpFrame> frames;
  int64_t allocated_bytes = 0;  // all bytes allocated so far
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
    rec->allocated_bytes += static_cast<int64_t>(nbytes);
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

// A fused attention kernel: its op (PyTorch 2.11's schemas, and the C++
// tracer's stand-ins, models/attention.cc), where its query is among the
// inputs (key next) and where is_causal is, and how many matrix products of
// QK^T's shape it runs per batch and head: forward QK^T and PV, backward
// five (S recomputed, dP, dV, dQ, dK), the FlashAttention-2 paper's count
// (Dao 2023, section 4.1: backward 2.5 times the forward). A causal mask
// skips about half of each (the same paper): counted as half the rows,
// rounded up.
struct FusedAttentionOp {
  const char* name;
  size_t query, causal;
  int64_t products;
};
constexpr FusedAttentionOp kFusedAttention[] = {
    {"aten::_scaled_dot_product_flash_attention", 0, 4, 2},
    {"aten::_scaled_dot_product_flash_attention_backward", 1, 11, 5},
    {"aten::_scaled_dot_product_efficient_attention", 0, 6, 2},
    {"aten::_scaled_dot_product_efficient_attention_backward", 1, 11, 5},
    {"aten::_scaled_dot_product_cudnn_attention", 0, 6, 2},
    {"aten::_scaled_dot_product_cudnn_attention_backward", 1, 14, 5},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", 0, 4, 2},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", 1, 7, 5},
    {"shardfit::fused_attention", 0, 3, 2},
    {"shardfit::fused_attention_backward", 0, 3, 5},
};

GemmShape fused_attention_shape(const std::string& name, c10::ArrayRef<const c10::IValue> in) {
  GemmShape g;
  g.count = 0;
  for (const auto& op : kFusedAttention) {
    if (name != op.name) continue;
    if (in.size() <= std::max(op.query + 1, op.causal) || !in[op.query].isTensor() || !in[op.query + 1].isTensor() ||
        !in[op.causal].isBool())
      return g;
    const auto q = in[op.query].toTensor().sizes(), k = in[op.query + 1].toTensor().sizes();  // [b, h, s, d]
    if (q.size() != 4 || k.size() != 4) return g;
    const int64_t rows = in[op.causal].toBool() ? (q[2] + 1) / 2 : q[2];
    return {op.products * q[0] * q[1], rows, k[2], q[3]};
  }
  return g;
}

// The shape of the matmul-like leaf ops every linear layer and attention
// product ends in (count 0: not one of them).
GemmShape matmul_shape(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  auto in = fn.inputs();
  if (name.find("_attention") != std::string::npos) return fused_attention_shape(name, in);
  auto shape = [&](size_t i) { return in[i].toTensor().sizes(); };
  auto two = [&](size_t a, size_t b) { return in.size() > b && in[a].isTensor() && in[b].isTensor(); };
  GemmShape g;
  g.count = 0;
  if (name == "aten::mm" && two(0, 1))
    g = {1, shape(0)[0], shape(1)[1], shape(0)[1]};
  else if (name == "aten::addmm" && two(1, 2))
    g = {1, shape(1)[0], shape(2)[1], shape(1)[1]};
  else if (name == "aten::bmm" && two(0, 1))
    g = {shape(0)[0], shape(0)[1], shape(1)[2], shape(0)[2]};
  else if (name == "aten::baddbmm" && two(1, 2))
    g = {shape(1)[0], shape(1)[1], shape(2)[2], shape(1)[2]};
  return g;
}

// The tracer's own module boundaries, which a training step without the
// tracer does not run: the identity autograd Function the Python recorder
// puts on each module's inputs and outputs (pytorch/trace_recorder.py
// ShardfitModuleBoundary: its forward, and its backward node as PyTorch
// names it, alone or under the engine's evaluate_function) and the C++
// tracer's callback node (models/autograd_hooks.cc, planner/trace.cc). The
// step's work leaves them out; their events still name the op they fall in.
bool tracer_own_op(const std::string& name) {
  static const std::string kPython = "ShardfitModuleBoundary", kPythonNode = kPython + "Backward",
                           kCpp = "shardfit::BackwardCallback";
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return name == kPython || ends_with(kPythonNode) || ends_with(kCpp);
}

// Ops that run no kernel: views and metadata (PyTorch's "Tensor Views" list,
// docs/source/tensor_view.rst, plus the allocation-only and aliasing ops the
// dispatcher shows). They touch no memory the roofline counts.
bool runs_no_kernel(const std::string& name) {
  static const std::unordered_set<std::string> kNone = {
      "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape", "aten::flatten",
      "aten::unflatten", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
      "aten::expand", "aten::expand_as", "aten::select", "aten::slice", "aten::narrow",
      "aten::unsqueeze", "aten::squeeze", "aten::split", "aten::split_with_sizes", "aten::chunk",
      "aten::unbind", "aten::diagonal", "aten::movedim", "aten::unfold", "aten::view_as",
      "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::empty",
      "aten::empty_like", "aten::empty_strided", "aten::resize_", "aten::set_", "aten::contiguous",
      "aten::numpy_T", "aten::matrix_H", "aten::mT", "aten::_indices", "aten::_values", "detach"};
  return kNone.count(name) > 0;
}

// The bytes of an op's tensor inputs (lists included; Python numbers not).
double input_bytes(const at::RecordFunction& fn) {
  double bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number())
      bytes += static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
  };
  for (const auto& v : fn.inputs()) {
    if (v.isTensor())
      add(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) add(t);
  }
  return bytes;
}

// Storages a real kernel allocates inside an op besides its outputs, which
// its meta kernel cannot show: sized when the op starts (its inputs are only
// readable then), recorded when it ends, after the outputs, as the real
// kernel allocates them. All are freed before the op returns.
// What a kernel allocates besides its outputs, in order: n >= 0 an
// allocation of n bytes, -(k + 1) the free of the k-th (from 0); those not
// freed in the list are freed as the op returns, the last made first.
struct KernelTemporaries final : at::ObserverContext {
  std::vector<int64_t> events;
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
  if (r.record_ops && tracer_own_op(fn.name())) {
    r.op_stack.push_back(r.intern_op(fn.name()));
    r.frames.push_back(Recorder::OpFrame{});  // no work of the step's
  } else if (r.record_ops) {
    r.op_stack.push_back(r.intern_op(fn.name()));
    // A kernel that calls another (a composite) is not counted itself; one
    // that only allocates its outputs or takes views (runs_no_kernel) is.
    if (!r.frames.empty() && !runs_no_kernel(fn.name())) r.frames.back().has_child = true;
    Recorder::OpFrame frame;
    PhaseWork& work = r.phase == Phase::kForward ? r.trace->forward_work : r.trace->backward_work;
    if (fn.scope() == at::RecordScope::FUNCTION) {
      const GemmShape g = matmul_shape(fn);
      if (g.count > 0) {
        (r.phase == Phase::kForward ? r.trace->forward_flops : r.trace->backward_flops) += g.flops();
        work.gemms.push_back(g);
      } else if (!runs_no_kernel(fn.name())) {
        frame.kernel = r.op_stack.back();
        frame.work = &work;
        frame.input_bytes = input_bytes(fn);
        frame.allocated_at_start = r.allocated_bytes;
      }
    } else {
      ++work.nodes;
    }
    r.frames.push_back(frame);
  }
  if (r.record_host_storages && fn.scope() == at::RecordScope::FUNCTION) {
    if (const int64_t cast = wrapped_number_cast_bytes(fn)) {
      auto t = std::make_unique<KernelTemporaries>();
      t->events = {cast};
      return t;
    }
  }
  if (r.cpu_bf16_threads > 0 && fn.scope() == at::RecordScope::FUNCTION) {
    // On LibTorch 2.x this runs the CPU kernel once (planner/cpu_matmul_probe.cc):
    // its CPU storages are not the traced step's host storages.
    struct Paused {
      bool& active;
      ~Paused() { active = true; }
    } paused{r.active};
    r.active = false;
    std::vector<int64_t> events = cpu_bf16_matmul_temporaries(fn.name(), fn.inputs(), r.cpu_bf16_threads);
    if (!events.empty()) {
      auto t = std::make_unique<KernelTemporaries>();
      t->events = std::move(events);
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
    std::vector<bool> freed;
    for (int64_t e : t->events) {
      if (e >= 0) {
        ids.push_back(r.next_tensor++);
        freed.push_back(false);
        r.push(MemEvent::kAlloc, r.current_module(), ids.back(), e);
      } else {
        const size_t k = static_cast<size_t>(-e - 1);
        r.push(MemEvent::kFree, r.current_module(), ids.at(k));
        freed.at(k) = true;
      }
    }
    for (size_t k = ids.size(); k-- > 0;)
      if (!freed[k]) r.push(MemEvent::kFree, r.current_module(), ids[k]);
  }
  if (r.record_ops && !r.op_stack.empty()) {
    r.op_stack.pop_back();
    const Recorder::OpFrame f = r.frames.back();
    r.frames.pop_back();
    if (f.kernel >= 0 && !f.has_child)
      f.work->add_kernel(r.trace->op_names[static_cast<size_t>(f.kernel)],
                         f.input_bytes + static_cast<double>(r.allocated_bytes - f.allocated_at_start));
  }
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
