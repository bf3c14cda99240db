#include "planner/batch_search.h"

#include <algorithm>
#include <tuple>

namespace shardfit::planner {
namespace {

// `a` moved `steps` batches along the line through a (batch k) and b (k+1):
// every matrix product's dimensions and each kernel's bytes are affine in
// the batch, the op counts constant. Empty when the two do not pair up.
PhaseWork affine_work(const PhaseWork& a, const PhaseWork& b, int64_t steps) {
  if (a.gemms.size() != b.gemms.size() || a.kernels.size() != b.kernels.size() || a.nodes != b.nodes) return {};
  PhaseWork w = a;
  for (size_t i = 0; i < w.kernels.size(); ++i) {
    const KernelWork& y = b.kernels[i];
    KernelWork& x = w.kernels[i];
    if (x.op != y.op || x.calls != y.calls) return {};
    x.bytes = std::max(0.0, x.bytes + static_cast<double>(steps) * (y.bytes - x.bytes));
  }
  for (size_t i = 0; i < w.gemms.size(); ++i) {
    auto dim = [&](int64_t x, int64_t y) { return std::max<int64_t>(0, x + steps * (y - x)); };
    const GemmShape& y = b.gemms[i];
    GemmShape& g = w.gemms[i];
    g = {dim(g.count, y.count), dim(g.m, y.m), dim(g.n, y.n), dim(g.k, y.k)};
  }
  return w;
}

}  // namespace

AffineTrace::AffineTrace(ModelTrace t1, const ModelTrace& t2) : base_(std::move(t1)) {
  if (t2.batch != base_.batch + 1 || base_.events.size() != t2.events.size())
    throw std::logic_error("trace of " + base_.model_name + " is not batch-affine: event counts differ between batch " +
                           std::to_string(base_.batch) + " and " + std::to_string(t2.batch));
  bytes_per_batch_.resize(base_.events.size());
  for (size_t i = 0; i < base_.events.size(); ++i) {
    const auto& a = base_.events[i];
    const auto& b = t2.events[i];
    if (a.kind != b.kind || a.module != b.module || a.phase != b.phase || a.tensor != b.tensor ||
        b.bytes < a.bytes)
      throw std::logic_error("trace of " + base_.model_name +
                             " is not batch-affine at event " + std::to_string(i));
    bytes_per_batch_[i] = b.bytes - a.bytes;
  }
  if (t2.output_tensor_bytes.size() != base_.output_tensor_bytes.size())
    throw std::logic_error("trace of " + base_.model_name + " is not batch-affine: its forward returns " +
                           std::to_string(base_.output_tensor_bytes.size()) + " tensors at batch " +
                           std::to_string(base_.batch) + ", " + std::to_string(t2.output_tensor_bytes.size()) +
                           " at " + std::to_string(t2.batch));
  for (size_t i = 0; i < t2.output_tensor_bytes.size(); ++i)
    output_bytes_per_batch_.push_back(t2.output_tensor_bytes[i] - base_.output_tensor_bytes[i]);
  next_forward_work_ = t2.forward_work;
  next_backward_work_ = t2.backward_work;
  forward_flops_per_batch_ = t2.forward_flops - base_.forward_flops;
  backward_flops_per_batch_ = t2.backward_flops - base_.backward_flops;
}

ModelTrace AffineTrace::at(int64_t batch) const {
  if (batch < base_.batch)
    throw std::logic_error("affine trace from batch " + std::to_string(base_.batch) + " asked for batch " +
                           std::to_string(batch));
  const int64_t steps = batch - base_.batch;
  ModelTrace t = base_;
  t.batch = batch;
  for (size_t i = 0; i < t.events.size(); ++i) t.events[i].bytes += steps * bytes_per_batch_[i];
  for (size_t i = 0; i < t.output_tensor_bytes.size(); ++i)
    t.output_tensor_bytes[i] += steps * output_bytes_per_batch_[i];
  t.forward_flops += steps * forward_flops_per_batch_;
  t.backward_flops += steps * backward_flops_per_batch_;
  std::tie(t.forward_work, t.backward_work) = work_at(batch);
  return t;
}

std::pair<PhaseWork, PhaseWork> AffineTrace::work_at(int64_t batch) const {
  const int64_t steps = batch - base_.batch;
  return {affine_work(base_.forward_work, next_forward_work_, steps),
          affine_work(base_.backward_work, next_backward_work_, steps)};
}

std::pair<double, double> AffineTrace::flops_at(int64_t batch) const {
  const double steps = static_cast<double>(batch - base_.batch);
  return {base_.forward_flops + steps * forward_flops_per_batch_,
          base_.backward_flops + steps * backward_flops_per_batch_};
}

std::vector<int64_t> AffineTrace::alloc_bytes(int64_t batch) const {
  if (batch < base_.batch)
    throw std::logic_error("affine trace from batch " + std::to_string(base_.batch) + " asked for batch " +
                           std::to_string(batch));
  const int64_t steps = batch - base_.batch;
  std::vector<int64_t> out;
  out.reserve(base_.events.size() / 2);
  for (size_t i = 0; i < base_.events.size(); ++i)
    if (base_.events[i].kind == MemEvent::kAlloc) out.push_back(base_.events[i].bytes + steps * bytes_per_batch_[i]);
  return out;
}

int64_t search_max_batch_below(const std::function<bool(int64_t)>& fits, int64_t upper) {
  if (upper < 1) return 0;
  if (fits(upper)) return upper;
  int64_t bad = upper, step = 1, good = 0;
  while (true) {  // gallop down until something fits
    const int64_t probe = bad - step;
    if (probe < 1) break;
    if (fits(probe)) {
      good = probe;
      break;
    }
    bad = probe;
    step *= 2;
  }
  if (good == 0) {
    if (bad == 1) return 0;
    if (!fits(1)) return 0;
    good = 1;
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    if (fits(mid)) good = mid; else bad = mid;
  }
  return good;
}

int64_t search_max_batch(const std::function<bool(int64_t)>& fits, int64_t max_batch) {
  if (max_batch < 1 || !fits(1)) return 0;
  int64_t good = 1, bad = -1;
  while (bad < 0) {  // double until something does not fit
    const int64_t next = std::min(good * 2, max_batch);
    if (next == good) return good;
    if (fits(next)) good = next; else bad = next;
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    if (fits(mid)) good = mid; else bad = mid;
  }
  return good;
}

int64_t search_max_batch_from(const std::function<bool(int64_t)>& fits, int64_t guess, int64_t max_batch) {
  if (max_batch < 1) return 0;
  guess = std::clamp<int64_t>(guess, 1, max_batch);
  int64_t good = 0, bad = -1;
  if (fits(guess)) {
    good = guess;
    for (int64_t step = 1; bad < 0; step *= 2) {  // gallop up
      const int64_t probe = std::min(good + step, max_batch);
      if (probe == good) return good;
      if (fits(probe)) good = probe; else bad = probe;
    }
  } else {
    bad = guess;
    for (int64_t step = 1; good == 0; step *= 2) {  // gallop down
      const int64_t probe = std::max<int64_t>(bad - step, 1);
      if (probe == bad) return 0;  // bad is 1: nothing fits
      if (fits(probe)) good = probe; else bad = probe;
    }
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    if (fits(mid)) good = mid; else bad = mid;
  }
  return good;
}

}  // namespace shardfit::planner
