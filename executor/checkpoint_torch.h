// Internal to executor/checkpoint.cc and executor/safetensors.cc: the dtype
// table's LibTorch side, and host copies of tensors to write.
#pragma once

#include <torch/torch.h>

#include "executor/checkpoint_io.h"

namespace shardfit::executor::ckpt {

struct TorchDType {
  const char* name;
  c10::ScalarType type;
};
inline constexpr TorchDType kTorchDTypes[] = {
    {"F64", c10::ScalarType::Double}, {"F32", c10::ScalarType::Float},
    {"F16", c10::ScalarType::Half},   {"BF16", c10::ScalarType::BFloat16},
    {"I64", c10::ScalarType::Long},   {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},  {"I8", c10::ScalarType::Char},
    {"U8", c10::ScalarType::Byte},    {"BOOL", c10::ScalarType::Bool},
};

// nullptr for a dtype the format does not carry.
inline const DTypeInfo* dtype_of(c10::ScalarType type) {
  for (const TorchDType& d : kTorchDTypes)
    if (type == d.type) return dtype_by_name(d.name);
  return nullptr;
}

inline c10::ScalarType scalar_type(const DTypeInfo* d) {
  for (const TorchDType& t : kTorchDTypes)
    if (std::string(d->name) == t.name) return t.type;
  throw std::logic_error(std::string("dtype ") + d->name + " has no LibTorch type");
}

// A contiguous CPU view of t (a copy only when it has to be).
inline torch::Tensor host_contiguous(const torch::Tensor& t) {
  torch::Tensor h = t.device().is_cpu() ? t : t.to(torch::kCPU);
  return h.contiguous();
}

}  // namespace shardfit::executor::ckpt
