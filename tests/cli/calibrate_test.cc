// `shardfit calibrate`: this machine's rates into a profile that plan and
// run then predict step time with. The rates themselves depend
// on the machine and its load, so what is checked is that they were
// measured, recorded with their source, and used.
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

using nlohmann::json;

TEST(Calibrate, WritesAProfileOfMeasuredRatesThatRunPredictsWith) {
  const std::string prof = temp_path("calibrated.json");
  const Result c = shardfit({"calibrate", "--device", "cpu", "--nproc", "2", "--out", prof});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const json p = json::parse(read_file(prof));
  EXPECT_EQ(p["name"], "cpu-calibrated");
  EXPECT_EQ(p["kind"], "cpu");
  const json base = json::parse(read_file(std::string(SHARDFIT_SOURCE_DIR) + "/profiles/cpu.json"));
  for (const char* key : {"peak_flops_per_s.fp32", "memory_bytes_per_s", "gpu_link.bytes_per_s", "gpu_link.latency_s",
                          "measured_kernels.op_overhead_s", "measured_kernels.matmul_flops_per_s.fp32",
                          "measured_kernels.kernel_bytes_per_s.fp32.aten::native_dropout"}) {
    const std::string src = p["sources"][key];
    EXPECT_EQ(src.rfind("measured by `shardfit calibrate --device cpu --nproc 2`", 0), 0u) << key << ": " << src;
  }
  EXPECT_GT(p["peak_flops_per_s"]["fp32"].get<double>(), 0);
  EXPECT_GT(p["gpu_link"]["bytes_per_s"].get<double>(), 0);
  EXPECT_GT(p["gpu_link"]["latency_s"].get<double>(), 0);
  // What the time model times each op with: a 4^3 grid of matmul shapes,
  // the compute-bound kernels by name, one op's dispatch.
  const json& k = p["measured_kernels"];
  EXPECT_EQ(k["matmul_dims"], json({16, 64, 256, 1024}));
  EXPECT_EQ(k["matmul_flops_per_s"]["fp32"].size(), 64u);
  EXPECT_GT(k["op_overhead_s"].get<double>(), 0);
  EXPECT_GT(k["kernel_bytes_per_s"]["fp32"]["aten::gelu"].get<double>(), 0);
  EXPECT_NE(p["peak_flops_per_s"]["fp32"], base["peak_flops_per_s"]["fp32"]);
  EXPECT_EQ(p["efficiency"]["flops"], base["efficiency"]["flops"]);  // estimates stay estimates

  const std::string out = temp_path("calibrated-run.json");
  const Result r = shardfit({"run", "--model", "gpt2-tiny", "--strategy", "zero3/fp32/wrap=block", "--nproc", "2",
                             "--seq-len", "16", "--steps", "3", "--profile", prof, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("on " + prof), std::string::npos) << r.out;
  const json rep = json::parse(read_file(out));
  EXPECT_EQ(rep["hardware"]["profile"], prof);
  EXPECT_GT(rep["run"]["step_time_s"]["predicted"].get<double>(), 0);
  // The memory prediction is the cpu profile's exact one, calibrated or not.
  EXPECT_EQ(rep["ranks"][0]["peak_error_pct"].get<double>(), 0.0);
  std::remove(out.c_str());

  // plan --device FILE records where the profile is, and run --plan (so
  // validate, and the accuracy matrix's MATRIX_PROFILE) predicts with it.
  const std::string plan = temp_path("calibrated-plan.json");
  const Result p2 = shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "16", "--gpus", "2", "--device", prof,
                              "--gpu-mem", "64MiB", "--strategies", "zero2/fp32/wrap=block", "--out", plan});
  ASSERT_EQ(p2.exit_code, 0) << p2.err;
  const json pj = json::parse(read_file(plan));
  EXPECT_EQ(pj["hardware"]["profile"], prof) << "temp_path is absolute: the recorded path is the same";
  const Result r2 = shardfit({"run", "--plan", plan, "--batch", "2", "--nproc", "2", "--steps", "2", "--out", out});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(json::parse(read_file(out))["hardware"]["profile"], prof);
  std::remove(out.c_str());
  std::remove(plan.c_str());
  std::remove(prof.c_str());
}

TEST(Calibrate, RefusesWhatItCannotMeasureInOneLine) {
  Result r = shardfit({"calibrate", "--device", "cuda", "--out", temp_path("x.json")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  r = shardfit({"calibrate", "--base", "h200-141gb", "--out", temp_path("x.json")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("not a cpu profile"), std::string::npos) << r.err;
  r = shardfit({"calibrate", "--stack", "tensorflow", "--out", temp_path("x.json")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--stack tensorflow: expected shardfit or pytorch"), std::string::npos) << r.err;
  // --stack pytorch measures PyTorch's AdamW first, in the project's Python:
  // one whose torch cannot be imported fails at once, naming it.
  r = shardfit({"calibrate", "--stack", "pytorch", "--out", temp_path("x.json")},
               "SHARDFIT_PYTHON=/nonexistent/python");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--stack pytorch: SHARDFIT_PYTHON=/nonexistent/python is not an executable file"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 30) << "it failed only after measuring";
  r = shardfit({"run", "--model", "gpt2-tiny", "--steps", "1", "--profile", "h200-141gb"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("a cpu profile"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace shardfit::cli_test
