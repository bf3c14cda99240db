// Batch-size search. Every activation of a transformer step is (batch ×
// something) or independent of batch, so two traces at consecutive batches
// k and k+1 give every storage's size at any batch ≥ k exactly:
// bytes(b) = bytes(k) + (b − k)·(bytes(k+1) − bytes(k)). The planner traces
// at batch 1 (exact: some ops take other paths for a batch of one, e.g.
// matmul folds a unit batch dimension, so batch 1 is not on the line), 2
// and 3, and simulates any batch from those instead of tracing each batch
// it tries.
#pragma once

#include <cstdint>
#include <utility>
#include <functional>
#include <stdexcept>

#include "planner/model_trace.h"

namespace shardfit::planner {

// The two traces must be of the same model and options at consecutive
// batches k and k+1; throws std::logic_error if their event streams differ
// in anything but sizes (then the model is not batch-affine there).
class AffineTrace {
 public:
  AffineTrace(ModelTrace at_batch_k, const ModelTrace& at_batch_k1);
  // The trace at `batch` (≥ k).
  ModelTrace at(int64_t batch) const;
  // Only the sizes of its allocations, in trace order (cheap).
  std::vector<int64_t> alloc_bytes(int64_t batch) const;
  const ModelTrace& base() const { return base_; }
  // Forward and backward FLOPs at any batch >= 1: FLOPs are linear in the
  // batch, so unlike the bytes they extrapolate below k too.
  std::pair<double, double> flops_at(int64_t batch) const;
  // Forward and backward PhaseWork at any batch >= 1, on the same line
  // (each empty where the two traces' ops do not pair up one to one).
  std::pair<PhaseWork, PhaseWork> work_at(int64_t batch) const;

 private:
  ModelTrace base_;                       // batch k
  std::vector<int64_t> bytes_per_batch_;  // per event: bytes(2) − bytes(1)
  std::vector<int64_t> output_bytes_per_batch_;  // the same per output tensor
  double forward_flops_per_batch_ = 0, backward_flops_per_batch_ = 0;
  PhaseWork next_forward_work_, next_backward_work_;  // batch k+1's
};

// The largest b in [0, max_batch] with fits(b) true, assuming fits is
// monotone (true up to some b, false after); fits(0) is never asked.
// Doubling then bisection: O(log b) calls.
int64_t search_max_batch(const std::function<bool(int64_t)>& fits, int64_t max_batch);

// The same answer for a monotone fits, searched from a guess (e.g. where an
// affine fit of the peak meets the budget): gallops up from `guess` (+1, +2,
// +4, ...) while it fits, or down while it does not, then bisects; two calls
// when the guess is the answer.
int64_t search_max_batch_from(const std::function<bool(int64_t)>& fits, int64_t guess, int64_t max_batch);

// The largest b in [0, upper] with fits(b), when fits(upper + 1) is known to
// be false (a bound from a cheaper model: the caching allocator never
// reserves less than the exact allocator allocates). Steps down 1, 2, 4, ...
// from `upper`, then bisects.
int64_t search_max_batch_below(const std::function<bool(int64_t)>& fits, int64_t upper);

}  // namespace shardfit::planner
