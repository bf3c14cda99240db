// TEST-ONLY STAND-IN, not PyTorch's file: the part of LibTorch 2.3+'s
// c10::Allocator interface that shardfit's allocator subclasses touch,
// declared from its documentation so that tests/compat/ can compile those
// subclasses against the 2.x form on a machine that has only LibTorch 1.13.
// Nothing here is linked or run.
//
// Declared after pytorch/pytorch c10/core/Allocator.h as of v2.3.0 (and
// unchanged in that respect through v2.11, the version on the device
// machine's image, /work/.library/device/KINDS.md):
//   - `virtual DataPtr allocate(size_t n) = 0;`  not const since
//     pytorch/pytorch#120969 (merged 2024-03-05, first in v2.3.0);
//   - `virtual void copy_data(void* dest, const void* src, std::size_t count)
//     const = 0;` a new pure virtual, with a protected `default_copy_data`
//     (a memcpy) for allocators of host memory;
//   - `DataPtr clone(const void* data, std::size_t n)` built on the two;
//   - `raw_deleter() const` (virtual, default nullptr), `raw_allocate`,
//     `raw_deallocate` and `is_simple_data_ptr` as before.
// DataPtr, DeleterFnPtr and Device keep their 1.x shape (c10/core/Device.h,
// c10/util/UniqueVoidPtr.h); DeviceType's numbering follows
// c10/core/DeviceType.h. Only declarations: -fsyntax-only needs no bodies.
#pragma once

#include <stddef.h>

#include <cstddef>
#include <cstdint>

#define SHARDFIT_TORCH2X_STANDIN 1

namespace c10 {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1, Meta = 14 };
using DeviceIndex = int8_t;

struct Device {
  Device(DeviceType type, DeviceIndex index = -1);
  DeviceType type() const;
  DeviceIndex index() const;
  bool is_cpu() const;
  bool is_cuda() const;
  bool has_index() const;

 private:
  DeviceType type_;
  DeviceIndex index_;
};

using DeleterFnPtr = void (*)(void*);

// Data pointer + deleter context + device; move-only like the real one.
class DataPtr {
 public:
  DataPtr();
  DataPtr(void* data, Device device);
  DataPtr(void* data, void* ctx, DeleterFnPtr ctx_deleter, Device device);
  DataPtr(DataPtr&&) noexcept;
  DataPtr& operator=(DataPtr&&) noexcept;
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  ~DataPtr();

  void* get() const;
  void* get_context() const;
  void* release_context();
  DeleterFnPtr get_deleter() const;
  Device device() const;
  explicit operator bool() const;

 private:
  void* data_;
  void* ctx_;
  DeleterFnPtr deleter_;
  Device device_;
};

struct Allocator {
  virtual ~Allocator() = default;

  // 2.3+: not const (an allocator's state changes when it allocates).
  virtual DataPtr allocate(size_t n) = 0;

  // 2.3+: a new allocation holding a copy of `n` bytes at `data`.
  DataPtr clone(const void* data, std::size_t n);

  virtual bool is_simple_data_ptr(const DataPtr& data_ptr) const;

  virtual DeleterFnPtr raw_deleter() const { return nullptr; }
  void* raw_allocate(size_t n);
  void raw_deallocate(void* ptr);

  // 2.3+: copies `count` bytes between two allocations of this allocator.
  virtual void copy_data(void* dest, const void* src, std::size_t count) const = 0;

 protected:
  void default_copy_data(void* dest, const void* src, std::size_t count) const;
};

void SetAllocator(DeviceType t, Allocator* alloc, uint8_t priority = 0);
Allocator* GetAllocator(const DeviceType& t);

}  // namespace c10
