#include "planner/trace.h"

#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>

#include "models/autograd_hooks.h"
#include "models/model.h"
#include "models/module_table.h"
#include "planner/meta_recording_allocator.h"

namespace shardfit::planner {

// meta_kernels.cc
void set_meta_kernels_target_cuda(bool cuda);
std::vector<int64_t> cpu_bf16_matmul_temporaries(const char* op, c10::ArrayRef<const c10::IValue> inputs,
                                                 int threads);

namespace {

// One trace at a time: the meta allocator and the op observer are global
// (autograd may run backward on another thread, so no thread_local state).
std::mutex g_trace_mu;

struct Recorder {
  bool active = false;
  ModelTrace* trace = nullptr;
  Phase phase = Phase::kForward;
  std::vector<int> forward_stack;   // modules running forward (or recompute)
  std::vector<int> backward_stack;  // modules whose backward has begun, not ended
  std::vector<int> op_stack;        // ops running (indices into op_names)
  std::unordered_map<std::string, int> op_index;
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

// Sees every module's forward; adds backward callbacks on its inputs
// (backward end) and output (backward begin); checkpoints the chosen ones.
class TracingRunner final : public models::ModuleRunner {
 public:
  explicit TracingRunner(std::vector<bool> checkpoint) : checkpoint_(std::move(checkpoint)) {}

  torch::Tensor run(models::ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                    const models::ModuleFn& fn) override {
    const int idx = module.index();
    g_rec.push(MemEvent::kModuleBegin, idx);
    g_rec.forward_stack.push_back(idx);
    auto ins = models::with_backward_callback(inputs, [idx] { end_backward(idx); });
    torch::Tensor y;
    if (idx >= 0 && idx < static_cast<int>(checkpoint_.size()) && checkpoint_[idx]) {
      y = models::checkpoint(ins, fn, [this, idx](bool begin) { recompute(idx, begin); });
    } else {
      y = fn(ins);
    }
    y = models::with_backward_callback({y}, [idx] { begin_backward(idx); })[0];
    g_rec.forward_stack.pop_back();
    g_rec.push(MemEvent::kModuleEnd, idx);
    return y;
  }

  static void begin_backward(int idx) {
    g_rec.phase = Phase::kBackward;
    g_rec.push(MemEvent::kModuleBegin, idx);
    g_rec.backward_stack.push_back(idx);
  }
  static void end_backward(int idx) {
    auto& st = g_rec.backward_stack;
    for (auto it = st.rbegin(); it != st.rend(); ++it) {
      if (*it == idx) {
        st.erase(std::next(it).base());
        break;
      }
    }
    g_rec.push(MemEvent::kModuleEnd, idx);
  }

 private:
  // Checkpointed module `idx` re-runs its forward inside backward. The
  // runner is re-installed: backward may run on an autograd worker thread.
  void recompute(int idx, bool begin) {
    if (begin) {
      previous_runner_ = models::current_runner();
      scoped_.emplace_back(std::make_unique<models::ScopedModuleRunner>(this));
      g_rec.phase = Phase::kRecompute;
      g_rec.push(MemEvent::kModuleBegin, idx);
      g_rec.forward_stack.push_back(idx);
    } else {
      g_rec.forward_stack.pop_back();
      g_rec.push(MemEvent::kModuleEnd, idx);
      g_rec.phase = Phase::kBackward;
      scoped_.pop_back();
    }
  }

  std::vector<bool> checkpoint_;
  models::ModuleRunner* previous_runner_ = nullptr;
  std::vector<std::unique_ptr<models::ScopedModuleRunner>> scoped_;
};

c10::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kF16: return torch::kHalf;
    case DType::kBF16: return torch::kBFloat16;
    default: return torch::kFloat;
  }
}

}  // namespace

ModelTrace trace_step(const models::ModelConfig& config, const TraceOptions& o) {
  if (o.batch < 1) throw std::invalid_argument("batch " + std::to_string(o.batch) + ": must be at least 1");
  models::check_seq_len(config, o.seq_len);
  std::lock_guard<std::mutex> lock(g_trace_mu);
  register_missing_meta_kernels();
  install_meta_allocator();
  set_meta_kernels_target_cuda(o.target_cuda);

  ModelTrace trace;
  trace.model_name = config.name;
  trace.batch = o.batch;
  trace.seq_len = o.seq_len;
  trace.compute_dtype = o.dtype;

  const auto opts = torch::TensorOptions().device(torch::kMeta).dtype(scalar_type(o.dtype));
  auto model = models::build_model(config, opts);
  trace.modules = models::module_table(*model);
  // Gradients exist before the step, as the executor's flat gradient views
  // do, so AccumulateGrad adds in place: the trace holds only the transient
  // gradient each backward op makes.
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);

  std::vector<bool> recompute(trace.modules.size(), false);
  for (int m : o.recompute_modules)
    if (m > 0 && m < static_cast<int>(recompute.size())) recompute[m] = true;
  TracingRunner runner(recompute);

  g_rec = Recorder{};
  g_rec.trace = &trace;
  g_rec.record_ops = o.record_ops;
  // bf16 only: fp32 products take CPU paths that allocate nothing besides
  // their outputs, and LibTorch 1.13 has no CPU Half matmul at all (fp16
  // does not run on the CPU). CUDA targets get no per-op rule: cuBLAS's
  // workspace is a fixed overhead from the device profile.
  if (!o.target_cuda && o.dtype == DType::kBF16)
    g_rec.cpu_bf16_threads = o.cpu_threads > 0 ? o.cpu_threads : at::get_num_threads();
  at::CallbackHandle handle = 0;
  if (g_rec.record_ops || g_rec.cpu_bf16_threads > 0)
    handle = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  g_rec.active = true;
  try {
    models::ScopedModuleRunner scoped(&runner);
    {
      const auto ids = torch::TensorOptions().device(torch::kMeta).dtype(torch::kLong);
      models::Batch batch;
      batch.input_ids = torch::empty({o.batch, o.seq_len}, ids);
      if (config.family == models::Family::kBert) {
        batch.token_type_ids = torch::empty({o.batch, o.seq_len}, ids);
        batch.attention_mask = torch::empty({o.batch, o.seq_len}, ids);
        batch.labels = config.masked_lm() ? torch::empty({o.batch, o.seq_len}, ids) : torch::empty({o.batch}, ids);
      }
      torch::Tensor loss = model->forward_loss(batch);
      g_rec.phase = Phase::kBackward;
      loss.backward();
      // Modules whose inputs need no gradient (embeddings, the root) have no
      // backward-end callback: their backward ends with the whole backward.
      while (!g_rec.backward_stack.empty()) TracingRunner::end_backward(g_rec.backward_stack.back());
    }  // the batch and the loss are freed here, inside the trace
  } catch (...) {
    g_rec.active = false;
    if (handle) at::removeCallback(handle);
    throw;
  }
  g_rec.active = false;
  if (handle) at::removeCallback(handle);
  g_rec.trace = nullptr;
  return trace;
}

}  // namespace shardfit::planner
