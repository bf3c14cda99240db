// How shardfit's tensors and reductions map onto NCCL's enums, in one
// place: the nccl backend (nccl_comm.cc) and its tests use it. Pure
// functions, no device needed. Included only where NCCL's headers are
// (targets linked to shardfit::nccl).
#pragma once

#include <nccl.h>

#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <stdexcept>
#include <string>

#include "executor/comm.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "shardfit's nccl backend needs NCCL >= 2.14 (ncclCommInitRankConfig, ncclAvg)"
#endif

namespace shardfit::executor {

// NCCL's element type for a tensor dtype. Bool travels as uint8 (as torch's
// ProcessGroupNCCL does): fine to gather and broadcast, but a sum of bools
// would wrap, so reductions refuse it (nccl_reduction_type). Types NCCL has
// no element for (int16, complex, quantized, ...) throw std::invalid_argument
// naming the dtype.
inline ncclDataType_t nccl_data_type(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Byte: return ncclUint8;
    case c10::ScalarType::Bool: return ncclUint8;
    case c10::ScalarType::Char: return ncclInt8;
    case c10::ScalarType::Int: return ncclInt32;
    case c10::ScalarType::Long: return ncclInt64;
    case c10::ScalarType::Half: return ncclFloat16;
    case c10::ScalarType::Float: return ncclFloat32;
    case c10::ScalarType::Double: return ncclFloat64;
    case c10::ScalarType::BFloat16: return ncclBfloat16;
// c10 has fp8 dtypes from LibTorch 2.1, NCCL from 2.24 (as torch's own
// NCCLUtils.hpp: NCCL_SUPPORTS_FP8).
#if (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)) && \
    NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case c10::ScalarType::Float8_e4m3fn: return ncclFloat8e4m3;
    case c10::ScalarType::Float8_e5m2: return ncclFloat8e5m2;
#endif
    default:
      break;
  }
  throw std::invalid_argument(std::string("nccl: no NCCL element type for dtype ") + c10::toString(t) +
                              " (use uint8/int8/int32/int64/float16/bfloat16/float32/float64)");
}

// The element type for a reduction: as nccl_data_type, but bool is refused.
inline ncclDataType_t nccl_reduction_type(c10::ScalarType t) {
  if (t == c10::ScalarType::Bool)
    throw std::invalid_argument("nccl: a reduction of bool tensors would wrap in uint8; reduce a uint8 or int32 copy");
  return nccl_data_type(t);
}

// Bytes per element as NCCL counts them (counts are in elements).
inline size_t nccl_element_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
#endif
    default: break;
  }
  throw std::invalid_argument("nccl: unknown ncclDataType_t " + std::to_string(static_cast<int>(t)));
}

// kAvg is NCCL's own ncclAvg (since 2.10): one pass, no division after the
// call, unlike gloo. Only for floating types (the Communicator contract).
inline ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw std::invalid_argument("nccl: unknown ReduceOp");
}

}  // namespace shardfit::executor
