// `--loss chunked:N`: the causal LM's cross-entropy computed N tokens at a
// time, never the whole tokens x vocab logits matrix. Forward keeps only the
// running sum; backward recomputes each chunk's logits from the saved hidden
// states and output weight and writes that chunk's gradients (the idea of
// Liger Kernel's fused linear cross-entropy and of torchtune's chunked
// output loss, written here with the aten ops the planner traces).
#pragma once

#include <torch/torch.h>

namespace shardfit::models {

// Mean cross-entropy of hidden [T, H] @ weight[V, H]^T against targets [T],
// logits in fp32, N = `chunk` tokens at a time. Differentiable in hidden and
// weight.
torch::Tensor chunked_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk);

}  // namespace shardfit::models
