// The --stack pytorch simulators' bookkeeping over an allocator model
// (planner/pytorch_ddp.cc: DDP, ZeroRedundancyOptimizer;
// planner/pytorch_fsdp.cc, pytorch_fsdp2.cc: FSDP), and the replay of a
// trace through it (defined in pytorch_stack.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/allocator_model.h"
#include "planner/model_trace.h"
#include "planner/step_simulator.h"

namespace shardfit::planner {

// The allocator (exact, as the CPU meter counts; or the CUDA caching
// allocator's model, whose pools are per stream: `stream` says which) with
// the step's bookkeeping: each storage by id and
// memory class, the peaks and where they were set, the timeline.
class Ledger {
 public:
  Ledger(AllocatorModel& allocator, StepSimResult* out) : a_(allocator), out_(out) { a_.reset(); }

  // The id of a new storage of `bytes`, or -1 on out of memory.
  int64_t alloc(Category c, int64_t bytes, const std::string& label, int stream = 0) {
    if (out_->oom) return -1;
    const int64_t id = static_cast<int64_t>(category_.size());
    if (!a_.alloc(id, bytes, stream)) {
      out_->oom = true;
      out_->oom_label = label;
      out_->oom_category = c;
      out_->oom_request_bytes = bytes;
      out_->oom_allocation_bytes = a_.allocation_size(bytes);
      out_->oom_allocated_bytes = a_.allocated_bytes();
      out_->oom_reserved_bytes = a_.reserved_bytes();
      return -1;
    }
    category_.push_back(c);
    charged_.push_back(a_.charged_bytes(id));
    by_[static_cast<int>(c)] += charged_.back();
    if (a_.allocated_bytes() > out_->peak_allocated_bytes) {
      out_->peak_allocated_bytes = a_.allocated_bytes();
      out_->peak_allocated_label = label;
      out_->peak_breakdown_bytes = by_;
    }
    if (a_.reserved_bytes() > out_->peak_reserved_bytes) {
      out_->peak_reserved_bytes = a_.reserved_bytes();
      out_->peak_reserved_label = label;
    }
    since_allocated_ = std::max(since_allocated_, a_.allocated_bytes());
    since_reserved_ = std::max(since_reserved_, a_.reserved_bytes());
    return id;
  }
  void free(int64_t id) {
    if (id < 0 || charged_[id] < 0) return;
    by_[static_cast<int>(category_[id])] -= charged_[id];
    charged_[id] = -1;
    a_.free(id);
  }
  void free_all(std::vector<int64_t>& ids) {
    for (int64_t id : ids) free(id);
    ids.clear();
  }
  void point(const std::string& label) {
    TimelinePoint p;
    p.label = label;
    p.allocated_bytes = a_.allocated_bytes();
    p.reserved_bytes = a_.reserved_bytes();
    p.peak_allocated_bytes = since_allocated_;
    p.peak_reserved_bytes = since_reserved_;
    out_->timeline.push_back(p);
    out_->timeline_category_bytes.push_back(by_);
    since_allocated_ = a_.allocated_bytes();
    since_reserved_ = a_.reserved_bytes();
  }
  void finish() { out_->num_alloc_retries = a_.num_alloc_retries(); }
  bool oom() const { return out_->oom; }

 private:
  AllocatorModel& a_;
  StepSimResult* out_;
  std::vector<Category> category_;  // by id
  std::vector<int64_t> charged_;    // by id; -1 once freed
  int64_t since_allocated_ = 0, since_reserved_ = 0;
  CategoryBytes by_{};
};

// Replays a trace that is not a model's step (opt.zero_grad(), an
// optimizer step) under `label`: storages still live at its end stay,
// charged to `kept` (the optimizer's state); the rest are `transient`. A
// model's step goes through walk_pytorch_step (pytorch_walk.h). False on
// out of memory.
bool replay(const ModelTrace& t, Ledger& ledger, const std::string& label, Category transient, Category kept);

// The phases of the loop every simulation here shares (DDP's in
// pytorch_ddp.cc, FSDP1's in pytorch_fsdp.cc, FSDP2's in pytorch_fsdp2.cc)
// around the walk through the model's step, each written once:
//
// A storage of each of `bytes`, charged to `c` under `label` (init's: the
// profile's cuBLAS workspaces before the model, the model's buffers), their
// ids appended to `ids` when given. False on out of memory.
bool alloc_each(Ledger& ledger, Category c, const std::vector<int64_t>& bytes, const std::string& label,
                std::vector<int64_t>* ids = nullptr);
// The model's buffers' bytes, in named_buffers() order.
std::vector<int64_t> buffer_bytes(const std::vector<BufferInfo>& buffers);
// The forward and backward of step `step` ("stepK") are done: what the
// forward returned beside the loss becomes the loop's `outputs` (dropped
// when the next forward returns), and the point stepK/backward is recorded.
void end_backward(Ledger& ledger, std::vector<int64_t>& outputs, std::vector<int64_t>& previous_outputs,
                  const std::string& step);
// opt.step(), or scaler.step(opt) then scaler.update() with `grad_scaler`
// (GradScaler, or ShardedGradScaler over `host_grads`: see
// grad_scaler_unscale): the gradients unscaled, the optimizer's traced step
// `adamw` replayed (its state kept; nullptr: it runs on the host, as under
// CPU offload), the scaler updated; then the point stepK/optimizer. False on
// out of memory.
bool optimizer_step(Ledger& ledger, const std::string& step, const ModelTrace* adamw, bool grad_scaler,
                    bool host_grads);

}  // namespace shardfit::planner
