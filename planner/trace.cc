#include "planner/trace.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/Parallel.h>

#include "models/autograd_hooks.h"
#include "models/model.h"
#include "models/module_table.h"
#include "planner/trace_recorder.h"

namespace shardfit::planner {

namespace {

// Sees every module's forward; adds backward callbacks on its inputs
// (backward end) and output (backward begin); checkpoints the chosen ones.
class TracingRunner final : public models::ModuleRunner {
 public:
  explicit TracingRunner(std::vector<bool> checkpoint) : checkpoint_(std::move(checkpoint)) {}

  torch::Tensor run(models::ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                    const models::ModuleFn& fn) override {
    const int idx = module.index();
    TraceRecording::forward_begin(idx);
    auto ins = models::with_backward_callback(inputs, [idx] { TraceRecording::backward_end(idx); });
    torch::Tensor y;
    if (idx >= 0 && idx < static_cast<int>(checkpoint_.size()) && checkpoint_[idx]) {
      y = models::checkpoint(ins, fn, [this, idx](bool begin) { recompute(idx, begin); });
    } else {
      y = fn(ins);
    }
    y = models::with_backward_callback({y}, [idx] { TraceRecording::backward_begin(idx); })[0];
    TraceRecording::forward_end(idx);
    return y;
  }

 private:
  // Checkpointed module `idx` re-runs its forward inside backward. The
  // runner is re-installed: backward may run on an autograd worker thread.
  void recompute(int idx, bool begin) {
    if (begin) {
      scoped_.emplace_back(std::make_unique<models::ScopedModuleRunner>(this));
      TraceRecording::recompute_begin(idx);
    } else {
      TraceRecording::recompute_end(idx);
      scoped_.pop_back();
    }
  }

  std::vector<bool> checkpoint_;
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
  ModelTrace trace;
  RecorderOptions ro;
  ro.record_ops = o.record_ops;
  ro.target_cuda = o.target_cuda;
  // bf16 only: fp32 products take CPU paths that allocate nothing besides
  // their outputs, and LibTorch 1.13 has no CPU Half matmul at all (fp16
  // does not run on the CPU). CUDA targets get no per-op rule: cuBLAS's
  // workspace is a fixed overhead from the device profile.
  if (!o.target_cuda && o.dtype == DType::kBF16)
    ro.cpu_bf16_threads = o.cpu_threads > 0 ? o.cpu_threads : at::get_num_threads();
  TraceRecording recording(&trace, ro);  // held from here: the model is built unrecorded, but alone
  trace.model_name = config.name;
  trace.batch = o.batch;
  trace.seq_len = o.seq_len;
  trace.compute_dtype = o.dtype;
  trace.recompute_modules = o.recompute_modules;
  std::sort(trace.recompute_modules.begin(), trace.recompute_modules.end());

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

  recording.start();
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
    TraceRecording::begin_backward_phase();
    loss.backward();
    TraceRecording::end_open_backwards();
  }  // the batch and the loss are freed here, inside the trace
  return trace;
}

}  // namespace shardfit::planner
