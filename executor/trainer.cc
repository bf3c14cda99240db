#include "executor/trainer.h"

#include <chrono>
#include <stdexcept>

#include <c10/util/Exception.h>

#include "executor/data.h"
#include "models/model.h"

namespace shardfit::executor {

TrainResult train_single_rank(const TrainOptions& o, const std::function<void(const StepLog&)>& on_step) {
  spec::check_batch(o.batch);
  spec::check_job_options(o);
  if (o.grad_accum != 1)
    throw std::invalid_argument("--grad-accum " + std::to_string(o.grad_accum) +
                                ": the single-rank trainer runs one micro-batch a step (the engine accumulates)");
  models::check_seq_len(o.model, o.seq_len);
  auto data = o.data == "synthetic" ? make_synthetic(o.model, o.seq_len, o.seed)
                                    : make_token_file(o.data, o.model, o.seq_len, o.batch);

  TrackingAllocator& meter = TrackingAllocator::cpu();
  TrainResult result;
  meter.reset_peak();
  const int64_t baseline = meter.allocated_bytes();  // storages that predate the run
  meter.set_budget_bytes(o.budget_bytes > 0 ? baseline + o.budget_bytes : 0);
  try {
    torch::manual_seed(o.seed);
    auto model = models::build_model(o.model, torch::TensorOptions().dtype(torch::kFloat));
    result.param_count = models::count_parameters(*model);
    AdamW optimizer(model->parameters(), o.adamw);
    meter.mark("init");

    // One flat gradient buffer, the parameters' .grad are views into it, and
    // it is zeroed (not freed) between steps: DDP's gradient_as_bucket_view,
    // and what the planner charges for ddp. Allocated at the first backward.
    torch::Tensor flat_grads;
    auto attach_flat_grads = [&] {
      int64_t total = 0;
      for (const auto& p : model->parameters()) total += p.numel();
      flat_grads = torch::zeros({total}, torch::kFloat);
      int64_t offset = 0;
      for (auto& p : model->parameters()) {
        p.mutable_grad() = flat_grads.narrow(0, offset, p.numel()).view(p.sizes());
        offset += p.numel();
      }
    };

    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto timed_from = start;
    for (int64_t step = 1; step <= o.steps; ++step) {
      const std::string tag = "step" + std::to_string(step);
      if (flat_grads.defined()) flat_grads.zero_();
      models::Batch batch = data->get(step, 0, o.batch);
      auto loss = model->forward_loss(batch);
      meter.mark(tag + "/forward");
      if (!flat_grads.defined()) attach_flat_grads();
      loss.backward();
      meter.mark(tag + "/backward");
      optimizer.step();
      meter.mark(tag + "/optimizer");
      result.loss.push_back(loss.item<double>());
      if (step == 1) timed_from = clock::now();
      const auto now = clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const int64_t timed_steps = o.steps >= 2 ? step - 1 : 1;
      const double timed_s = std::chrono::duration<double>(now - (o.steps >= 2 ? timed_from : start)).count();
      if (timed_steps > 0 && timed_s > 0)
        result.tokens_per_s = static_cast<double>(timed_steps * o.batch * o.seq_len) / timed_s;
      if (on_step) on_step({step, o.steps, result.loss.back(), result.tokens_per_s, elapsed});
    }
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) {
      meter.set_budget_bytes(0);
      throw;
    }
    result.oom = true;
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    result.oom_message = c10e ? c10e->what_without_backtrace() : e.what();
    meter.mark("oom");
  }
  meter.set_budget_bytes(0);
  result.peak_allocated_bytes = meter.peak_allocated_bytes() - baseline;
  result.timeline = meter.timeline();
  for (auto& t : result.timeline) {
    t.allocated_bytes -= baseline;
    t.peak_allocated_bytes -= baseline;
  }
  return result;
}

}  // namespace shardfit::executor
