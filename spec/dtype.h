// The element types a strategy stores and computes in. fp32 is the master
// weights' and optimizer state's type under every precision; fp16 and bf16
// are the compute (and gradient-reduction) types of mixed precision.
#pragma once

#include <cstdint>

namespace shardfit::spec {

enum class DType : uint8_t { kF32, kF16, kBF16 };
inline int64_t dtype_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

}  // namespace shardfit::spec
