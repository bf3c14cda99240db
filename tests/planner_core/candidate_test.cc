// Candidate ids (SPEC.md's grammar and aliases) and the default sweep with
// the --strategies / --precision filters.
#include "planner/candidate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "tests/support/error_of.h"

namespace shardfit::planner {
namespace {

using test_support::error_of;

std::set<std::string> ids(const std::vector<Candidate>& candidates) {
  std::set<std::string> out;
  for (const Candidate& c : candidates) out.insert(c.to_id());
  return out;
}

// Titan RTX: Turing, no bf16.
CandidateOptions titan_options() {
  CandidateOptions o;
  o.supported_precisions = {Precision::kFp32, Precision::kFp16};
  o.device_name = "titan-rtx-24gb";
  return o;
}

TEST(CandidateTest, ParsesSpecExamples) {
  Candidate c = parse_candidate("zero3+offload/fp32/wrap=size:2000");
  EXPECT_EQ(c.sharding, Sharding::kZero3);
  EXPECT_TRUE(c.offload);
  EXPECT_FALSE(c.recompute);
  EXPECT_EQ(c.precision, Precision::kFp32);
  EXPECT_EQ(c.wrap, "size:2000");
  EXPECT_EQ(c.to_id(), "zero3+offload/fp32/wrap=size:2000");

  EXPECT_EQ(parse_candidate("ddp/fp16/wrap=none").to_id(), "ddp/fp16/wrap=none");
  EXPECT_EQ(parse_candidate("zero2/bf16/wrap=block").to_id(), "zero2/bf16/wrap=block");
}

TEST(CandidateTest, AliasesAndOrderCanonicalize) {
  EXPECT_EQ(parse_candidate("no_shard/fp32/wrap=none").to_id(), "ddp/fp32/wrap=none");
  EXPECT_EQ(parse_candidate("shard_grad_op/fp32/wrap=block").to_id(), "zero2/fp32/wrap=block");
  EXPECT_EQ(parse_candidate("FULL_SHARD+ckpt+offload/bf16/wrap=size:002000").to_id(),
            "zero3+offload+ckpt/bf16/wrap=size:2000");
  EXPECT_EQ(parse_candidate("hybrid_shard/fp16/wrap=block").to_id(), "hybrid/fp16/wrap=block");
  EXPECT_EQ(parse_candidate("zero3/fp32/wrap=block"),
            parse_candidate("full_shard/fp32/wrap=block"));
}

TEST(CandidateTest, RoundTripsEveryCandidateOfTheSweep) {
  CandidateOptions o;
  o.supported_precisions = {Precision::kFp32, Precision::kFp16, Precision::kBf16};
  o.nodes = 2;
  for (const Candidate& c : enumerate_candidates(o)) EXPECT_EQ(parse_candidate(c.to_id()), c);
}

TEST(CandidateTest, ErrorsNameTheTextAndThePart) {
  struct Case {
    const char* text;
    const char* part;
  };
  for (const Case& k :
       {Case{"zero4/fp32/wrap=none", "sharding 'zero4'"},
        Case{"zero3+cpu/fp32/wrap=none", "'+cpu'"}, Case{"zero3+ckpt+ckpt/fp32/wrap=none", "twice"},
        Case{"zero3/fp8/wrap=none", "precision 'fp8'"}, Case{"zero3/fp32/size:2000", "wrap="},
        Case{"zero3/fp32/wrap=size:0", "wrap policy 'size:0'"},
        Case{"zero3/fp32/wrap=size:2k", "wrap policy 'size:2k'"}, Case{"zero3/fp32", "three"},
        Case{"zero3/fp32/wrap=none/x", "three"}, Case{"", "three"}}) {
    std::string err = error_of([&] { parse_candidate(k.text); });
    EXPECT_NE(err.find(std::string("'") + k.text + "'"), std::string::npos) << err;
    EXPECT_NE(err.find(k.part), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

TEST(CandidateTest, DefaultSweepOnOneTitanNode) {
  std::vector<Candidate> all = enumerate_candidates(titan_options());
  std::set<std::string> got = ids(all);
  EXPECT_EQ(got.size(), all.size()) << "duplicates";
  // ddp: ckpt × 2 precisions; zero1: offload × ckpt × 2; zero2/zero3:
  // offload × ckpt × 2 × 4 wraps each.
  EXPECT_EQ(all.size(), 4u + 8u + 32u + 32u);
  for (const char* id : {"ddp/fp32/wrap=none", "ddp/fp16/wrap=none", "ddp+ckpt/fp32/wrap=block",
                         "zero1+offload/fp16/wrap=none", "zero2/fp32/wrap=size:1000000",
                         "zero3/fp32/wrap=size:2000", "zero3+offload/fp32/wrap=size:2000",
                         "zero3+offload+ckpt/fp16/wrap=block", "zero2+ckpt/fp16/wrap=none"}) {
    EXPECT_TRUE(got.count(id)) << id;
  }
  for (const Candidate& c : all) {
    EXPECT_NE(c.precision, Precision::kBf16) << "no bf16 on Turing";
    EXPECT_NE(c.sharding, Sharding::kHybrid) << "hybrid needs nodes > 1";
    EXPECT_FALSE(c.sharding == Sharding::kDdp && c.offload) << c.to_id();
  }
  EXPECT_EQ(all.front().to_id(), "ddp/fp32/wrap=none");  // stable order
}

TEST(CandidateTest, HybridAndBf16WhenTheSettingAllows) {
  CandidateOptions o;
  o.supported_precisions = {Precision::kFp32, Precision::kFp16, Precision::kBf16};
  o.nodes = 2;
  std::set<std::string> got = ids(enumerate_candidates(o));
  EXPECT_TRUE(got.count("hybrid/bf16/wrap=block"));
  EXPECT_TRUE(got.count("hybrid+offload+ckpt/fp32/wrap=size:2000"));
  EXPECT_EQ(got.size(), 6u + 12u + 3 * 48u);
}

TEST(CandidateTest, StrategiesFilterByShardingOrFullId) {
  CandidateOptions o = titan_options();
  o.strategies = split_list("full_shard, ddp/fp16/wrap=none");
  std::vector<Candidate> got = enumerate_candidates(o);
  EXPECT_EQ(got.size(), 32u + 1u);
  for (const Candidate& c : got)
    EXPECT_TRUE(c.sharding == Sharding::kZero3 || c.to_id() == "ddp/fp16/wrap=none") << c.to_id();

  // A full id outside the sweep is kept as asked; repeats collapse.
  o.strategies = {"zero3/fp32/wrap=size:5000", "full_shard/fp32/wrap=size:5000"};
  got = enumerate_candidates(o);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].to_id(), "zero3/fp32/wrap=size:5000");
}

TEST(CandidateTest, PrecisionFilter) {
  CandidateOptions o = titan_options();
  o.precisions = {"fp16"};
  for (const Candidate& c : enumerate_candidates(o)) EXPECT_EQ(c.precision, Precision::kFp16);
  o.precisions = {"all"};
  EXPECT_EQ(enumerate_candidates(o).size(), enumerate_candidates(titan_options()).size());
}

TEST(CandidateTest, ImpossibleRequestsAreOneLineErrors) {
  CandidateOptions o = titan_options();
  o.precisions = {"bf16"};
  std::string err = error_of([&] { enumerate_candidates(o); });
  EXPECT_NE(err.find("bf16 is not supported by titan-rtx-24gb"), std::string::npos) << err;

  o = titan_options();
  o.strategies = {"zero2/bf16/wrap=block"};
  err = error_of([&] { enumerate_candidates(o); });
  EXPECT_NE(err.find("zero2/bf16/wrap=block"), std::string::npos) << err;
  EXPECT_NE(err.find("titan-rtx-24gb"), std::string::npos) << err;

  o = titan_options();
  o.strategies = {"ddp+offload/fp32/wrap=none"};
  EXPECT_NE(error_of([&] { enumerate_candidates(o); }).find("sharded state"), std::string::npos);

  o = titan_options();
  o.strategies = {"hybrid"};
  EXPECT_NE(error_of([&] { enumerate_candidates(o); }).find("--nodes > 1"), std::string::npos);

  o = titan_options();
  o.strategies = {"zero9"};
  err = error_of([&] { enumerate_candidates(o); });
  EXPECT_NE(err.find("'zero9'"), std::string::npos) << err;

  o = titan_options();
  o.strategies = {"zero3/fp16/wrap=block"};
  o.precisions = {"fp32"};
  EXPECT_NE(error_of([&] { enumerate_candidates(o); }).find("--precision"), std::string::npos);

  o = titan_options();
  o.precisions = {"fp64"};
  EXPECT_NE(error_of([&] { enumerate_candidates(o); }).find("'fp64'"), std::string::npos);
}

TEST(CandidateTest, SplitsLists) {
  EXPECT_EQ(split_list("a, b,,c ,"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_list("").empty());
}

}  // namespace
}  // namespace shardfit::planner
