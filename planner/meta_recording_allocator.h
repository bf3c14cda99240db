// The meta device's allocator while shardfit traces (planner/trace.cc): it
// hands out no memory (meta tensors have none) but a DataPtr whose context
// carries a storage id, so the deleter can record the free. Outside a trace
// it records nothing.
//
// This header includes only c10's allocator interface (compat/c10_allocator.h)
// so that tests/compat/ can compile the class against LibTorch 2.3+'s form of
// c10::Allocator on a machine that has only 1.13.
#pragma once

#include <cstddef>

#include "compat/c10_allocator.h"

namespace shardfit::planner {

class MetaRecordingAllocator final : public c10::Allocator {
 public:
  // allocate() (and copy_data() on LibTorch 2.3+: meta storages hold no
  // bytes, so there is nothing to copy) in this LibTorch's form.
  SHARDFIT_C10_ALLOCATOR_OVERRIDES(allocate_recorded, shardfit::compat::copy_no_bytes)
  // The DataPtr's deleter: records the free of the storage id in `ctx`.
  static void release(void* ctx);

 private:
  c10::DataPtr allocate_recorded(size_t nbytes) const;
};

}  // namespace shardfit::planner
