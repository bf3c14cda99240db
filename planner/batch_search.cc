#include "planner/batch_search.h"

#include <algorithm>

namespace shardfit::planner {

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
  return t;
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
