// What `plan` prints by default (each strategy family's best, its memory
// breakdown, why the chosen one won), the bf16-over-fp16 tie-break, and a
// sweep's grid and JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "planner/plan_output.h"
#include "planner/plan_text.h"

namespace shardfit::planner {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanCandidate row(const std::string& id, int64_t batch, double tokens_per_s) {
  PlanCandidate c;
  c.candidate = parse_candidate(id);
  c.max_batch_per_gpu = batch;
  c.predicted.peak_reserved_bytes = 20 * kGiB;
  c.predicted.peak_allocated_bytes = 19 * kGiB;
  c.predicted.breakdown.params_bytes = 3 * kGiB;
  c.predicted.breakdown.grads_bytes = 2 * kGiB;
  c.predicted.breakdown.optimizer_bytes = 6 * kGiB;
  c.predicted.breakdown.activations_bytes = 7 * kGiB;
  c.predicted.breakdown.temporaries_bytes = kGiB / 2;
  c.predicted.breakdown.comm_buffers_bytes = kGiB / 4;
  c.predicted.breakdown.overhead_bytes = kGiB / 4;
  c.predicted.tokens_per_s = tokens_per_s;
  c.predicted.step_time_s = batch > 0 ? 1.0 : 0;
  c.limit = "activations in step2/backward/root";
  return c;
}

Plan family_plan() {
  Plan p;
  p.model = {"gpt2-large", 774030080, 128};
  p.hardware = {"a100-80gb", 24 * kGiB, 2, 1};
  p.candidates = {row("ddp/fp32/wrap=none", 0, 0),          row("zero2/fp16/wrap=none", 10, 1000),
                  row("zero2/bf16/wrap=none", 10, 1000),       row("zero2/fp16/wrap=block", 9, 900),
                  row("zero3/bf16/wrap=block", 12, 950),       row("zero3+ckpt/bf16/wrap=block", 40, 700)};
  p.candidates[0].predicted.peak_reserved_bytes = 30 * kGiB;
  p.chosen = p.candidates[*choose(p.candidates, p.objective)].id();
  return p;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t b = 0, e; b < text.size(); b = e + 1) {
    e = text.find('\n', b);
    lines.push_back(text.substr(b, e - b));
  }
  return lines;
}

TEST(PlanChoice, Bf16WinsAFullTieWithFp16) {
  const Plan p = family_plan();
  EXPECT_EQ(p.chosen, "zero2/bf16/wrap=none");
  // Either order: the tie-break is bf16's, not the candidates' order.
  std::vector<PlanCandidate> swapped = {p.candidates[2], p.candidates[1]};
  EXPECT_EQ(swapped[*choose(swapped, Objective::kThroughput)].id(), "zero2/bf16/wrap=none");
  EXPECT_EQ(swapped[*choose(swapped, Objective::kBatch)].id(), "zero2/bf16/wrap=none");
  // Not a tie: the faster fp16 wins.
  swapped[1].predicted.tokens_per_s = 1001;
  EXPECT_EQ(swapped[*choose(swapped, Objective::kThroughput)].id(), "zero2/fp16/wrap=none");
}

TEST(PlanSummary, EachFamilysBestWithItsBreakdownAndTheUnfitInOneLine) {
  const std::string s = format_plan_summary(family_plan());
  const std::vector<std::string> lines = lines_of(s);
  ASSERT_GE(lines.size(), 6u) << s;
  EXPECT_NE(lines[0].find("gpt2-large, seq len 128"), std::string::npos) << s;
  // Families best first: zero2 (chosen, marked), zero3, zero3+ckpt; zero2's
  // fp16 twin and its wrap=block variant are left to --all.
  EXPECT_NE(lines[1].find("params"), std::string::npos) << s;
  EXPECT_EQ(lines[2].rfind("*  zero2/bf16/wrap=none", 0), 0u) << s;
  EXPECT_NE(lines[3].find("zero3/bf16/wrap=block"), std::string::npos) << s;
  EXPECT_NE(lines[4].find("zero3+ckpt/bf16/wrap=block"), std::string::npos) << s;
  EXPECT_EQ(s.find("zero2/fp16/wrap=block"), std::string::npos) << s;
  EXPECT_EQ(s.find("zero2/fp16/wrap=none"), std::string::npos) << s;
  // The breakdown, in GiB: params 3, grads 2, optimizer 6, activations 7, the
  // rest (temporaries, comm buffers, overhead) 1.
  for (const char* cell : {"20.00", "3.00", "2.00", "6.00", "7.00", "1.00"})
    EXPECT_NE(lines[2].find(cell), std::string::npos) << cell << " in " << lines[2];
  EXPECT_NE(s.find("nothing fits batch 1 with ddp (the least, ddp/fp32/wrap=none, fits batch 1 in 30.00 GiB per GPU)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("--all lists all 6 candidates (1 fit no batch)"), std::string::npos) << s;
}

TEST(PlanSummary, SaysWhyTheChosenWonWhatStopsItAndByHowMuch) {
  Plan p = family_plan();
  PlanCandidate::Oom oom;
  oom.batch = 11;
  oom.allocation_bytes = kGiB;
  oom.allocated_bytes = 19 * kGiB;
  oom.reserved_bytes = 20 * kGiB;
  p.candidates[2].oom = oom;
  const std::string why = explain_choice(p);
  EXPECT_NE(why.find("why: zero2/bf16/wrap=none is the fastest that fits (--objective throughput): 1000 tokens/s at "
                     "batch 10 per GPU."),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("Batch 11 runs out of memory (activations in step2/backward/root): it asks for 1.00 GiB with "
                     "19.00 GiB allocated and 20.00 GiB reserved of the allocator's 24.00 GiB."),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("bf16 over fp16 at the same batch and speed"), std::string::npos) << why;
  // The runner-up comes from another family: zero3, not zero2's fp16 twin.
  EXPECT_NE(why.find("Runner-up (another strategy): zero3/bf16/wrap=block, 5.0% fewer tokens/s (950) at batch 12"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("The largest batch: zero3+ckpt/bf16/wrap=block, 30.0% fewer tokens/s (700) at batch 40"),
            std::string::npos)
      << why;
  // By batch, the other way round.
  p.objective = Objective::kBatch;
  p.chosen = p.candidates[*choose(p.candidates, p.objective)].id();
  const std::string by_batch = explain_choice(p);
  EXPECT_NE(by_batch.find("why: zero3+ckpt/bf16/wrap=block fits the largest batch (--objective batch): 40 per GPU"),
            std::string::npos)
      << by_batch;
  EXPECT_NE(by_batch.find("The fastest: zero2/bf16/wrap=none, 42.9% more tokens/s (1000) at batch 10"),
            std::string::npos)
      << by_batch;
}

TEST(PlanSummary, NothingFits) {
  Plan p = family_plan();
  p.candidates = {p.candidates[0]};
  p.chosen = "";
  const std::string s = format_plan_summary(p);
  EXPECT_NE(s.find("no candidate fits batch 1"), std::string::npos) << s;
  EXPECT_EQ(s.find("why:"), std::string::npos) << s;
}

TEST(PlanSweep, OneGridLinePerPointAndOnePlanPerPointInItsJson) {
  Plan a = family_plan();
  Plan b = family_plan();
  b.model.seq_len = 256;
  b.hardware.nodes = 2;
  b.candidates.push_back(row("hybrid/bf16/wrap=block", 14, 800));
  const std::string grid = format_sweep_grid({a, b});
  const std::vector<std::string> lines = lines_of(grid);
  ASSERT_EQ(lines.size(), 4u) << grid;  // title, header, two points
  EXPECT_NE(lines[1].find("ddp  zero2  zero3  hybrid"), std::string::npos) << grid;
  // Each sharding's largest batch: zero3's is zero3+ckpt's 40; ddp fits none;
  // the first point planned no hybrid.
  EXPECT_NE(lines[2].find("128     2      1   24.00 GiB    0     10     40       -  zero2/bf16/wrap=none"),
            std::string::npos)
      << grid;
  EXPECT_NE(lines[3].find("256     2      2   24.00 GiB    0     10     40      14"), std::string::npos) << grid;
  const nlohmann::json j = nlohmann::json::parse(sweep_to_json_text({a, b}));
  EXPECT_EQ(j["schema"], kPlanSweepSchema);
  ASSERT_EQ(j["plans"].size(), 2u);
  EXPECT_EQ(j["plans"][1]["schema"], kPlanSchema);
  EXPECT_EQ(parse_plan(j["plans"][1].dump()).model.seq_len, 256);
}

}  // namespace
}  // namespace shardfit::planner
