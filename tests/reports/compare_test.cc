// compare's checks on reports built in memory: memory gates everywhere, and
// throughput only against a baseline measured on the same machine (a bf16
// baseline's tokens/s from a CPU with AVX-512 would fail every run on a CPU
// without it).
#include "reports/compare.h"

#include <gtest/gtest.h>

#include <fstream>

namespace shardfit::reports {
namespace {

Machine epyc() {
  return {"AMD EPYC 9R14 96-Core Processor",
          {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
          1 << 20,
          1};
}

Machine no_avx512() { return {"Intel(R) Xeon(R) CPU E5-2680 v4", {"avx2"}, 256 << 10, 1}; }

RunReport report(double tokens_per_s, double peak_error_pct, const Machine& m) {
  RunReport r;
  r.candidate = "zero3/bf16/wrap=block";
  r.device = "cpu";
  r.tokens_per_s = tokens_per_s;
  r.machine = m;
  RankReport rank;
  rank.measured.peak_allocated_bytes = 1000;
  rank.peak_error_pct = peak_error_pct;
  r.ranks.push_back(rank);
  r.max_batch_predicted = r.max_batch_measured = 8;
  return r;
}

const CompareCheck* find(const CompareResult& res, const std::string& what) {
  for (const auto& c : res.checks)
    if (c.what == what) return &c;
  return nullptr;
}

TEST(Compare, BaselineTenTimesFasterOnAnotherCpuStillPassesOnMemory) {
  const RunReport base = report(20499, 0, epyc());
  const RunReport here = report(2050, 0, no_avx512());
  const CompareResult res = compare_reports(here, &base, {});
  EXPECT_TRUE(res.passed());
  const CompareCheck* speed = find(res, "throughput vs baseline");
  ASSERT_NE(speed, nullptr);
  EXPECT_NE(speed->detail.find("not compared"), std::string::npos) << speed->detail;
  EXPECT_NE(speed->detail.find("E5-2680"), std::string::npos) << speed->detail;
}

TEST(Compare, SameMachineSlowdownGatesUnlessIgnored) {
  const RunReport base = report(20499, 0, epyc());
  const RunReport here = report(2050, 0, epyc());
  EXPECT_FALSE(compare_reports(here, &base, {}).passed());
  CompareOptions ci;
  ci.gate_throughput = false;
  const CompareResult res = compare_reports(here, &base, ci);
  EXPECT_TRUE(res.passed());
  EXPECT_NE(find(res, "throughput vs baseline")->detail.find("not gated"), std::string::npos);
}

TEST(Compare, BaselineWithoutMachineIsNotASpeedReference) {
  RunReport base = report(20499, 0, epyc());
  base.machine.reset();
  EXPECT_TRUE(compare_reports(report(10, 0, epyc()), &base, {}).passed());
}

TEST(Compare, MemoryStillGatesOnAnyMachine) {
  const RunReport base = report(20499, 0, epyc());
  CompareOptions ci;
  ci.gate_throughput = false;
  // 2% under-prediction: over the CPU's 1% tolerance and 2 pp worse than the baseline.
  EXPECT_FALSE(compare_reports(report(2050, -2.0, no_avx512()), &base, ci).passed());
  RunReport wrong_batch = report(2050, 0, no_avx512());
  wrong_batch.max_batch_measured = 7;
  EXPECT_FALSE(compare_reports(wrong_batch, &base, ci).passed());
}

TEST(Machine, ParsesCpuinfoFlagsThatMatter) {
  const Machine m = machine_from_cpuinfo(
      "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
      "flags\t\t: fpu avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile\n"
      "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n");
  EXPECT_EQ(m.cpu_model, "Intel(R) Xeon(R) Processor");
  const std::vector<std::string> want = {"avx2",     "avx512f",     "avx512bw", "avx512vl",
                                         "avx512dq", "avx512_bf16", "amx_bf16"};
  EXPECT_EQ(m.isa_flags, want);
  // A flag that is a prefix of another is not mistaken for it.
  EXPECT_TRUE(machine_from_cpuinfo("flags : avx512fx avx2\n").isa_flags == std::vector<std::string>{"avx2"});
}

TEST(Machine, RoundTripsThroughTheReport) {
  RunReport r = report(1, 0, epyc());
  const RunReport back = report_from_json(to_json(r), "test");
  ASSERT_TRUE(back.machine.has_value());
  EXPECT_EQ(describe(*back.machine), describe(epyc()));
  nlohmann::json bad = to_json(r);
  bad["machine"] = {{"cpu_model", 3}};
  EXPECT_THROW(report_from_json(bad, "test"), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::reports

namespace shardfit::reports {
namespace {

TEST(Machine, ReadsThisMachinesL2WhereSysfsHasIt) {
  const Machine m = this_machine(3);
  EXPECT_EQ(m.threads_per_rank, 3);
  if (!std::ifstream("/sys/devices/system/cpu/cpu0/cache/index2/size"))
    GTEST_SKIP() << "no sysfs cache information on this machine";
  EXPECT_GT(m.l2_cache_bytes, 0);  // sysfs lines end in '\n': "2048K\n"
}

}  // namespace
}  // namespace shardfit::reports

namespace shardfit::reports {
namespace {

// The report carries the step time, measured and predicted. 4
// ranks x batch 2 x seq 64 = 512 tokens a step at 1024 tokens/s is 0.5 s.
TEST(StepTime, MeasuredFromTokensPerSecondBesideTheModelsPrediction) {
  RunReport r = report(1024, 0, epyc());
  set_step_time(r, 4 * 2 * 64, 0.4);
  ASSERT_TRUE(r.step_time_measured_s && r.step_time_predicted_s && r.step_time_error_pct);
  EXPECT_DOUBLE_EQ(*r.step_time_measured_s, 0.5);
  EXPECT_DOUBLE_EQ(*r.step_time_predicted_s, 0.4);
  EXPECT_DOUBLE_EQ(*r.step_time_error_pct, -20.0);  // predicted 20% short, the sign of peak_error_pct
  const RunReport back = report_from_json(to_json(r), "test");
  EXPECT_EQ(back.step_time_measured_s, r.step_time_measured_s);
  EXPECT_EQ(back.step_time_predicted_s, r.step_time_predicted_s);
  EXPECT_EQ(back.step_time_error_pct, r.step_time_error_pct);

  set_step_time(r, 512, std::nullopt);  // no prediction: the measurement alone
  EXPECT_TRUE(r.step_time_measured_s);
  EXPECT_FALSE(r.step_time_predicted_s || r.step_time_error_pct);
  r.tokens_per_s = 0;  // nothing timed (a run that went out of memory in step 1)
  set_step_time(r, 512, 0.4);
  EXPECT_FALSE(r.step_time_measured_s || r.step_time_error_pct);
  // Reports from before the fields: absent, not an error; wrong type: one line.
  nlohmann::json old = to_json(report(1024, 0, epyc()));
  old["run"].erase("step_time_s");
  old["run"].erase("step_time_error_pct");
  EXPECT_FALSE(report_from_json(old, "old").step_time_error_pct);
  old["run"]["step_time_s"] = {{"measured", "slow"}};
  EXPECT_THROW(report_from_json(old, "old"), std::invalid_argument);
}

TEST(RunReport, CarriesWhatInitRead) {
  RunReport r = report(1024, 0, epyc());
  r.init_from = "/ckpt/model.safetensors";
  r.init_data_bytes = 4000;
  r.ranks.resize(2);
  r.ranks[0].init_read_bytes = 2000;
  r.ranks[1].rank = 1;
  r.ranks[1].init_read_bytes = 2000;
  const RunReport back = report_from_json(to_json(r), "test");
  EXPECT_EQ(back.init_from, r.init_from);
  EXPECT_EQ(back.init_data_bytes, 4000);
  ASSERT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[1].init_read_bytes, 2000);
  // Without --init: no field, nothing read back.
  const nlohmann::json plain = to_json(report(1024, 0, epyc()));
  EXPECT_TRUE(plain["run"]["init"].is_null());
  EXPECT_TRUE(report_from_json(plain, "plain").init_from.empty());
  nlohmann::json bad = to_json(r);
  bad["run"]["init"]["data_bytes"] = "4k";
  EXPECT_THROW(report_from_json(bad, "bad"), std::invalid_argument);
}

TEST(StepTime, ComparePrintsItAndGatesOnlyWhenAsked) {
  RunReport r = report(1024, 0, epyc());
  set_step_time(r, 512, 0.4);  // -20%
  const CompareResult plain = compare_reports(r, nullptr, {});
  EXPECT_TRUE(plain.passed());
  const CompareCheck* c = find(plain, "step time");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->detail.find("-20.0%"), std::string::npos) << c->detail;
  EXPECT_NE(c->detail.find("not gated"), std::string::npos) << c->detail;
  CompareOptions tight;
  tight.max_step_time_error_pct = 15;
  EXPECT_FALSE(compare_reports(r, nullptr, tight).passed());
  tight.max_step_time_error_pct = 25;
  EXPECT_TRUE(compare_reports(r, nullptr, tight).passed());
}

}  // namespace
}  // namespace shardfit::reports
