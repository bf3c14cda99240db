// The engine's unit state machine (executor/engine_impl.h): the hooks a
// wrapped unit passes through in forward and backward, detected from the
// model's module calls and autograd's identity nodes, and at each hook the
// actions the strategy's schedule lists (spec/schedule.h), carried out on
// the unit's FlatParam.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/engine_impl.h"

namespace shardfit::executor::engine_detail {
namespace {

bool any_requires_grad(const std::vector<torch::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

void Engine::zero_grad() { run_hook(spec::Hook::kZeroGrad, -1); }

void Engine::run_hook(spec::Hook hook, int u) {
  const spec::HookContext where{u >= 0 && u == root_unit_, last_micro_};
  for (spec::Op op : schedule_.actions(hook, where)) {
    if (u >= 0) {
      apply(op, u);
    } else if (op == spec::Op::kFreeShardGrad) {  // the step's: every unit
      for (size_t v = 0; v < flat_.size(); ++v) apply(op, static_cast<int>(v));
    } else {
      apply(op, -1);
    }
  }
}

// What each action does to tensors (spec/schedule.h says what it is;
// FlatParam allocates what the simulator charges for it).
void Engine::apply(spec::Op op, int u) {
  switch (op) {
    case spec::Op::kGather:
      flat_[u]->unshard(*shard_group_);  // nothing when UNSHARDED
      return;
    case spec::Op::kReshard:
      flat_[u]->reshard();  // nothing when SHARDED
      return;
    case spec::Op::kPrefetchForward:
    case spec::Op::kPrefetchBackward: {
      // The next units in forward order (known once a forward has run: in
      // the first one this unit is the last seen), or in backward order,
      // the units that ran forward just before this one.
      const auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
      if (it == forward_order_.end()) return;
      const int pos = static_cast<int>(it - forward_order_.begin());
      const int count = static_cast<int>(forward_order_.size());
      for (int k = 1, at; (at = schedule_.prefetch_position(op, pos, k, count)) >= 0; ++k) {
        FlatParam& next = *flat_[forward_order_[at]];  // nothing when UNSHARDED
        if (schedule_.async_gather()) {
          next.launch_unshard(*shard_group_);  // its own kGather waits
        } else {
          next.unshard(*shard_group_);
        }
      }
      return;
    }
    case spec::Op::kAllocGrad:
      flat_[u]->alloc_unsharded_grad();
      return;
    case spec::Op::kReduceScatter:
      flat_[u]->launch_reduce_grad(*shard_group_, replicate_);
      if (flat_[u]->reduce_in_flight()) in_flight_.push_back(u);
      return;
    case spec::Op::kAllReduce:
      // A bucket (at kGradReady), or every bucket not launched yet (u < 0).
      for (int b : buckets_.launch(u)) launch_bucket(b);
      return;
    case spec::Op::kWaitReduce:
      // Every reduction in flight, in the order they were launched: a
      // unit's, or a bucket's (then the units it completes are done).
      for (int v : in_flight_) {
        if (traits_.shard_params) {
          flat_[v]->finish_reduce_grad();
          continue;
        }
        bucket_work_[v]->wait();
        bucket_work_[v].reset();
        for (int w : buckets_.bucket_reduced(v)) flat_[w]->grads_reduced();
      }
      in_flight_.clear();
      return;
    case spec::Op::kAllocFlatGrad:
      if (!flat_grad_.defined()) alloc_flat_grad();
      return;
    case spec::Op::kZeroFlatGrad:
      if (flat_grad_.defined()) flat_grad_.zero_();
      return;
    case spec::Op::kFreeShardGrad:
      flat_[u]->free_shard_grad();
      return;
    case spec::Op::kRebuildBuckets:
    case spec::Op::kBroadcastBuffers:
    case spec::Op::kCloneOutputs:
      break;  // PyTorch's DDP's (spec/schedule.h), never the engine's schedule
  }
  throw std::logic_error(std::string("the engine has no action ") + spec::op_name(op));
}

torch::Tensor Engine::run(models::ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                          const models::ModuleFn& fn) {
  const int idx = module.index();
  const int u = idx >= 0 && idx < static_cast<int>(unit_of_root_.size()) ? unit_of_root_[idx] : -1;
  const bool recompute = in_recompute_;
  if (u >= 0) {
    // Only the outermost call of a unit's root module gathers / reshards.
    if (!recompute) {
      if (fwd_depth_[u]++ == 0) pre_forward(u);
    } else if (rcp_depth_[u]++ == 0) {
      run_hook(spec::Hook::kRecompute, u);
    }
    // Each call whose inputs carry gradient ends its backward on them.
    if (torch::GradMode::is_enabled() && any_requires_grad(inputs)) ++ends_left_[u];
  }
  // Every module gets the identity nodes, as under the tracer, so autograd
  // runs the very graph the planner traced; only units' nodes act.
  std::function<void()> on_end, on_begin;
  if (u >= 0) {
    on_end = [this, u] { backward_end(u); };
    on_begin = [this, u] { pre_backward(u); };
  }
  std::vector<torch::Tensor> ins = models::with_backward_callback(inputs, std::move(on_end));
  torch::Tensor y;
  if (idx >= 0 && idx < static_cast<int>(recompute_.size()) && recompute_[idx]) {
    y = models::checkpoint(ins, fn, [this, idx](bool begin) { on_recompute(idx, begin); });
  } else {
    y = fn(ins);
  }
  y = models::with_backward_callback({y}, std::move(on_begin))[0];
  if (u >= 0) {
    if (!recompute) {
      if (--fwd_depth_[u] == 0) post_forward(u);
    } else {
      --rcp_depth_[u];
    }
  }
  return y;
}

// FORWARD: zero2/3/hybrid gather the unit if it is SHARDED.
void Engine::pre_forward(int u) {
  if (!forward_seen_[u]) {
    forward_seen_[u] = true;
    forward_order_.push_back(u);
  }
  run_hook(spec::Hook::kPreForward, u);
}

void Engine::post_forward(int u) {
  run_hook(spec::Hook::kPostForward, u);
  mark(prefix_ + "forward/" + unit_name(u));
}

// PRE_BACKWARD (the unit's output gradient is ready). A unit used twice
// acts at its first span only.
void Engine::pre_backward(int u) {
  if (bwd_begun_[u]) return;
  bwd_begun_[u] = true;
  open_.push_back(u);
  run_hook(spec::Hook::kPreBackward, u);
}

// The unit's input gradients are ready: POST_BACKWARD once its last span ends.
void Engine::backward_end(int u) {
  if (ends_left_[u] > 0 && --ends_left_[u] > 0) return;
  if (!bwd_begun_[u] || bwd_done_[u]) return;
  post_backward(u);
}

void Engine::post_backward(int u) {
  bwd_done_[u] = true;
  open_.erase(std::find(open_.begin(), open_.end(), u));
  run_hook(spec::Hook::kPostBackward, u);
  mark(prefix_ + "backward/" + unit_name(u));
}

// Checkpointed module `module` re-runs its forward. The runner is
// re-installed for the recomputation (autograd may run it on another thread).
void Engine::on_recompute(int module, bool begin) {
  if (begin) {
    recompute_scopes_.push_back(std::make_unique<models::ScopedModuleRunner>(this));
    in_recompute_ = true;
    const int u = unit_of_root_[module];
    if (u >= 0) run_hook(spec::Hook::kRecompute, u);
  } else {
    in_recompute_ = false;
    recompute_scopes_.pop_back();
  }
}

// Units whose inputs need no gradient have no backward-end node: their
// backward ends with the whole backward, latest begun first (the tracer's
// order).
void Engine::close_open_units() {
  while (!open_.empty()) post_backward(open_.back());
}

}  // namespace shardfit::executor::engine_detail
