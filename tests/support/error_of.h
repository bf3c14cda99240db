// The one-line message a bad input raises, for tests that check it (SPEC:
// bad input names itself in one line). Header-only, no LibTorch.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace shardfit::test_support {

// The message of the std::invalid_argument `fn` throws; fails the test if it
// throws nothing.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

}  // namespace shardfit::test_support
