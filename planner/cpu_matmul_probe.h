// What LibTorch 2.x's own CPU kernels allocate inside a bf16 matrix product,
// measured on the kernel itself (planner/cpu_matmul_probe.cc).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace shardfit::planner {

// What LibTorch's kernel allocates and frees on the CPU inside one bf16
// aten::mm, addmm, bmm or baddbmm besides its output (operand copies, the
// oneDNN scratchpad), in order: n >= 0 an allocation of n bytes, -(k + 1)
// the free of the k-th allocation (from 0); one still live when the op
// returns is freed then. `inputs` are
// the op's (meta) arguments; the kernel runs once on CPU tensors of their
// sizes, strides and dtypes with `threads` intra-op threads (oneDNN books
// its scratchpad per thread). Cached per shape. Empty for any other op.
std::vector<int64_t> probe_cpu_bf16_matmul(const char* op, c10::ArrayRef<const c10::IValue> inputs, int threads);

}  // namespace shardfit::planner
