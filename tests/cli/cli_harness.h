// The cli_user_tests' view of the shared subprocess runner
// (tests/support/shardfit_process.h).
#pragma once

#include "tests/support/shardfit_process.h"

namespace shardfit::cli_test {
using test_support::expect_bad_input;
using test_support::joined;
using test_support::read_file;
using test_support::Result;
using test_support::shardfit;
using test_support::temp_path;
}  // namespace shardfit::cli_test
