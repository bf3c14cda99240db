// A c10::Allocator subclass spelled only for LibTorch < 2.3 (allocate()
// const, no copy_data): what tests/compat/ must refuse. ctest compiles it
// (-fsyntax-only) against the 2.3+ stand-in and expects the compiler to
// reject it ("does not override"), which shows that the stand-in is strict
// enough to catch the 1.13 form in the real allocators; against LibTorch
// 1.13 it must compile, which shows the probe itself is sound.
#include <c10/core/Allocator.h>

#include <cstddef>
#include <type_traits>

namespace {

class OneXOnlyAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t /*nbytes*/) const override {
    return {nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::CPU)};
  }
};

static_assert(!std::is_abstract_v<OneXOnlyAllocator>, "abstract");

}  // namespace
