// Sizes printed in the unit that fits (MiB under 1 GiB), and `plan --top N`.
#include <gtest/gtest.h>

#include <string>

#include "planner/plan_output.h"
#include "planner/plan_text.h"
#include "planner/profile.h"

namespace shardfit::planner {
namespace {

TEST(FormatSize, PicksTheUnitThatFits) {
  EXPECT_EQ(format_size(int64_t{25394413568}), "23.65 GiB");
  EXPECT_EQ(format_size(int64_t{12} << 20), "12.00 MiB");
  EXPECT_EQ(format_size((int64_t{1} << 30) - (int64_t{1} << 20)), "1023.00 MiB");
  EXPECT_EQ(format_size(600 * 1024), "600.00 KiB");
  EXPECT_EQ(format_size(512), "512 B");
}

PlanCandidate row(const std::string& id, int64_t batch, int64_t peak) {
  PlanCandidate c;
  c.candidate = parse_candidate(id);
  c.max_batch_per_gpu = batch;
  c.predicted.peak_reserved_bytes = peak;
  c.predicted.peak_allocated_bytes = peak;
  c.predicted.tokens_per_s = 100.0 * static_cast<double>(batch);
  c.predicted.step_time_s = 1;
  return c;
}

Plan small_plan() {
  Plan p;
  p.model = {"gpt2-tiny", 123, 64};
  p.hardware = {"cpu", int64_t{12} << 20, 2, 1};
  p.candidates = {row("ddp/fp32/wrap=none", 5, int64_t{11} << 20),
                  row("zero1/fp32/wrap=none", 6, int64_t{11} << 20),
                  row("zero2/fp32/wrap=block", 7, int64_t{11} << 20),
                  row("zero3/fp32/wrap=block", 8, int64_t{11} << 20)};
  p.chosen = "ddp/fp32/wrap=none";  // ranks last by batch
  return p;
}

TEST(PlanTable, SmallBudgetsPrintInMiB) {
  const std::string t = format_plan_table(small_plan());
  EXPECT_NE(t.find("usable memory 12.00 MiB per GPU"), std::string::npos) << t;
  EXPECT_NE(t.find("reserved MiB"), std::string::npos) << t;
  EXPECT_NE(t.find("11.00"), std::string::npos) << t;
  EXPECT_EQ(t.find("0.01"), std::string::npos) << t;
}

TEST(PlanTable, TopNKeepsTheBestRowsAndTheChosenOne) {
  const std::string t = format_plan_table(small_plan(), 2);
  EXPECT_NE(t.find("zero3/fp32/wrap=block"), std::string::npos);
  EXPECT_NE(t.find("zero2/fp32/wrap=block"), std::string::npos);
  EXPECT_EQ(t.find("zero1/fp32/wrap=none"), std::string::npos) << t;
  EXPECT_NE(t.find("*  ddp/fp32/wrap=none"), std::string::npos) << t;  // chosen: always shown
  EXPECT_NE(t.find("... 1 more candidate (--top 0 shows all)"), std::string::npos) << t;
  EXPECT_EQ(format_plan_table(small_plan(), 0), format_plan_table(small_plan(), 10));
}

}  // namespace
}  // namespace shardfit::planner
