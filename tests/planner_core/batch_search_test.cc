// planner/batch_search.h: the batch searches agree with each other and with
// the truth for every monotone fits, and a good guess costs two calls.
#include "planner/batch_search.h"

#include <gtest/gtest.h>

namespace shardfit::planner {
namespace {

TEST(BatchSearch, EverySearchFindsTheLargestBatchThatFits) {
  for (int64_t max_batch : {1, 2, 3, 7, 16, 40, 64}) {
    for (int64_t largest = 0; largest <= 70; ++largest) {  // fits(b) iff b <= largest
      auto fits = [&](int64_t b) {
        EXPECT_GE(b, 1);
        EXPECT_LE(b, max_batch);
        return b <= largest;
      };
      const int64_t want = std::min(largest, max_batch);
      EXPECT_EQ(search_max_batch(fits, max_batch), want) << largest << " " << max_batch;
      for (int64_t guess = -3; guess <= 80; guess += 1)
        EXPECT_EQ(search_max_batch_from(fits, guess, max_batch), want)
            << "largest " << largest << " max " << max_batch << " guess " << guess;
    }
  }
}

TEST(BatchSearch, AGuessThatIsTheAnswerCostsTwoCalls) {
  int calls = 0;
  auto fits = [&](int64_t b) {
    ++calls;
    return b <= 37;
  };
  EXPECT_EQ(search_max_batch_from(fits, 37, 1024), 37);
  EXPECT_EQ(calls, 2);  // 37 fits, 38 does not
  calls = 0;
  EXPECT_EQ(search_max_batch(fits, 1024), 37);
  EXPECT_GT(calls, 2);  // doubling then bisection: 1, 2, ..., 64, then 48, 40, 36, 38, 37
}

}  // namespace
}  // namespace shardfit::planner
