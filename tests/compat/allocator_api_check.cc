// Every c10::Allocator subclass in the tree, compiled (-fsyntax-only, never
// linked) by tests/compat/check_allocator_api.sh against either the
// LibTorch in use or tests/compat/torch2x/ (a hand-written stand-in of
// LibTorch 2.3+'s c10::Allocator): each must be concrete and override
// allocate() in that LibTorch's form, and copy_data() where it exists.
// A subclass spelled for one form only fails here: an `override` that
// overrides nothing, or a class left abstract.
#include <cstddef>
#include <type_traits>

#include "compat/c10_allocator.h"
#include "executor/tracking_allocator.h"
#include "planner/meta_recording_allocator.h"
#include "planner/probe_cpu_allocator.h"
#include "tests/executor_comm/counting_allocator.h"
#include "tests/planner/recording_cpu_allocator.h"

// The ctest says which form it compiles against, so that a version header
// read wrongly cannot pass as the other form.
#ifdef SHARDFIT_EXPECT_ALLOCATOR_2_3
static_assert(
    SHARDFIT_C10_ALLOCATOR_2_3 == SHARDFIT_EXPECT_ALLOCATOR_2_3,
    "compat/c10_allocator.h chose the wrong c10::Allocator form for this torch/version.h");
#endif

namespace {

#if SHARDFIT_C10_ALLOCATOR_2_3
template <typename A>
using AllocateFn = c10::DataPtr (A::*)(size_t);
#else
template <typename A>
using AllocateFn = c10::DataPtr (A::*)(size_t) const;
#endif

template <typename A>
constexpr bool overrides_this_form() {
  static_assert(std::is_base_of_v<c10::Allocator, A>, "not a c10::Allocator");
  static_assert(!std::is_abstract_v<A>,
                "abstract: a pure virtual of this c10::Allocator is not overridden");
  static_assert(
      std::is_same_v<decltype(&A::allocate), AllocateFn<A>>,
      "allocate() is not declared in this LibTorch's form (SHARDFIT_C10_ALLOCATOR_OVERRIDES)");
#if SHARDFIT_C10_ALLOCATOR_2_3
  static_assert(
      std::is_same_v<decltype(&A::copy_data), void (A::*)(void*, const void*, std::size_t) const>,
      "copy_data() is not overridden");
#endif
  return true;
}

static_assert(overrides_this_form<shardfit::executor::TrackingAllocator>());
static_assert(overrides_this_form<shardfit::planner::MetaRecordingAllocator>());
static_assert(overrides_this_form<shardfit::executor::CountingAllocator>());
static_assert(overrides_this_form<shardfit::planner::RecordingCpuAllocator>());
static_assert(overrides_this_form<shardfit::planner::ProbeCpuAllocator>());

}  // namespace
