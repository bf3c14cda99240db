// Autograd plumbing shared by the planner's tracer and the executor:
//  - a callback when backward passes a set of tensors (FSDP's pre-backward
//    hook on a module's output, post-backward on its inputs);
//  - activation checkpointing of a module: forward without saving
//    activations, recompute from the saved inputs in backward (PyTorch's
//    reentrant torch.utils.checkpoint, in C++).
// Both are identity on values and allocate nothing in forward (outputs are
// aliases of their inputs).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "models/module_base.h"

namespace shardfit::models {

// Returns `tensors` with those that require grad replaced by aliases whose
// backward calls `on_backward` once, after the gradients of all of them have
// been computed. When none requires grad (or grad mode is off) the tensors
// are returned unchanged and `on_backward` never runs.
std::vector<torch::Tensor> with_backward_callback(const std::vector<torch::Tensor>& tensors,
                                                  std::function<void()> on_backward);

// Calls `on_accumulated` each time autograd has accumulated a gradient into
// the leaf tensor `param`'s .grad: a post-hook on its AccumulateGrad node, as
// DDP's reducer registers one per parameter (c10d reducer.cpp,
// Reducer::autograd_hook). Returns that node: the tensor holds it only
// weakly, so the caller keeps it for as long as the hook should run.
// Throws std::invalid_argument when `param` is not a leaf requiring grad.
std::shared_ptr<torch::autograd::Node> after_grad_accumulated(const torch::Tensor& param,
                                                              std::function<void()> on_accumulated);

// Runs fn(inputs) without keeping its activations; in backward, re-runs it
// with grad enabled (calling on_recompute(true) before and (false) after)
// and back-propagates through the recomputed graph. Every tensor fn reads
// that needs a gradient must be in `inputs`.
torch::Tensor checkpoint(const std::vector<torch::Tensor>& inputs, ModuleFn fn,
                         std::function<void(bool begin)> on_recompute = {});

}  // namespace shardfit::models
