// c10::Allocator across LibTorch versions: the one place that knows how a
// subclass must spell its overrides.
//
//   LibTorch < 2.3   DataPtr allocate(size_t) const = 0;   no copy_data
//   LibTorch >= 2.3  DataPtr allocate(size_t) = 0;          (non-const)
//                    void copy_data(void* dest, const void* src,
//                                   std::size_t count) const = 0;
//
// Sources: c10/core/Allocator.h in Debian's libtorch-dev 1.13.1 (the const
// form) and in PyTorch v2.3.0 onwards (the form on the right); allocate lost
// its const in pytorch/pytorch#120969 (merged 2024-03-05, first released in
// 2.3). A subclass written for one form does not compile on the other (an
// `override` that overrides nothing) or stays abstract.
//
// So each subclass writes its logic once, as two const members, and lets
// SHARDFIT_C10_ALLOCATOR_OVERRIDES declare the virtual functions in this
// LibTorch's form:
//
//   class MyAllocator final : public c10::Allocator {
//    public:
//     SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_bytes, copy_bytes)
//    private:
//     c10::DataPtr allocate_bytes(size_t nbytes) const;
//     void copy_bytes(void* dest, const void* src, std::size_t count) const;
//   };
//
// copy_bytes may instead be one of the helpers below. tests/compat/ compiles
// every subclass in the tree against a hand-written stand-in of the 2.3+
// interface and against the LibTorch in use (ctest -R allocator_api).
//
// Deliberately light: c10/core/Allocator.h and torch/version.h only, so the
// allocator headers that include this one compile against that stand-in.
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>
#include <cstring>

#if !defined(TORCH_VERSION_MAJOR) || !defined(TORCH_VERSION_MINOR)
#error "compat/c10_allocator.h: no TORCH_VERSION_MAJOR/MINOR in torch/version.h"
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// 1 when c10::Allocator has the 2.3+ form (non-const allocate, copy_data).
#define SHARDFIT_C10_ALLOCATOR_2_3 1
#define SHARDFIT_C10_ALLOCATE_CONST
#define SHARDFIT_C10_COPY_DATA_OVERRIDE(COPY_FN)                                  \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    COPY_FN(dest, src, count);                                                    \
  }
#else
#define SHARDFIT_C10_ALLOCATOR_2_3 0
#define SHARDFIT_C10_ALLOCATE_CONST const
#define SHARDFIT_C10_COPY_DATA_OVERRIDE(COPY_FN)
#endif

// allocate() and, on 2.3+, copy_data(), forwarding to the subclass's
// `c10::DataPtr ALLOCATE_FN(size_t) const` and
// `void COPY_FN(void* dest, const void* src, std::size_t count) const`.
#define SHARDFIT_C10_ALLOCATOR_OVERRIDES(ALLOCATE_FN, COPY_FN)                \
  c10::DataPtr allocate(size_t nbytes) SHARDFIT_C10_ALLOCATE_CONST override { \
    return ALLOCATE_FN(nbytes);                                               \
  }                                                                           \
  SHARDFIT_C10_COPY_DATA_OVERRIDE(COPY_FN)

namespace shardfit::compat {

// copy_data for an allocator of plain host memory: a memcpy, as 2.3+'s
// Allocator::default_copy_data does, with a zero-byte copy of null pointers
// allowed (a zero-size storage has no data).
inline void copy_host_bytes(void* dest, const void* src, std::size_t count) {
  if (count > 0) std::memcpy(dest, src, count);
}

// copy_data for an allocator that hands out no memory (the meta device):
// there are no bytes to copy.
inline void copy_no_bytes(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) {}

}  // namespace shardfit::compat
