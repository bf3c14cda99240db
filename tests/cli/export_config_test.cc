// `shardfit export-config`: a plan's candidate as a Python module, FSDP
// kwargs, an Accelerate YAML and a DeepSpeed config; what a target cannot express is exit 2 with
// one line. (The mapping itself: tests/planner_core/launch_config_test.cc.)
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

std::string make_plan(int nodes) {
  const std::string plan = temp_path("plan.json");
  const Result r = shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "64", "--gpus", "2",
                             "--nodes", std::to_string(nodes), "--device", "cpu", "--gpu-mem",
                             "12MiB", "--precision", "fp32", "--out", plan});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return plan;
}

TEST(ExportConfig, WritesEachFormatForAPlannedCandidate) {
  const std::string plan = make_plan(1);
  const std::string id = "zero3+offload/fp32/wrap=block";
  Result r = shardfit({"export-config", "--plan", plan, "--candidate", id, "--format", "fsdp"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto fsdp = nlohmann::json::parse(r.out);
  EXPECT_EQ(fsdp["fsdp_kwargs"]["sharding_strategy"], "FULL_SHARD");
  EXPECT_EQ(fsdp["fsdp_kwargs"]["auto_wrap_policy"]["transformer_layer_cls"][0], "GPT2Block");
  EXPECT_TRUE(fsdp["fsdp_kwargs"]["cpu_offload"]["offload_params"].get<bool>());
  EXPECT_GT(fsdp["train"]["batch_size_per_gpu"].get<int>(), 0);
  EXPECT_NE(r.err.find("note: "), std::string::npos);  // notes go to stderr, not into the JSON

  const std::string out = temp_path("accelerate.yaml");
  r = shardfit(
      {"export-config", "--plan", plan, "--candidate", id, "--format", "accelerate", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.empty());
  const std::string yaml = read_file(out);
  std::remove(out.c_str());
  EXPECT_NE(yaml.find("\ndistributed_type: FSDP\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  fsdp_transformer_layer_cls_to_wrap: GPT2Block\n"), std::string::npos);
  EXPECT_NE(yaml.find("\nnum_processes: 2\n"), std::string::npos);

  r = shardfit({"export-config", "--plan", plan, "--candidate", id, "--format", "python"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cpu_offload=CPUOffload(offload_params=True)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ndef apply(model, device=None):\n"), std::string::npos);

  // Default candidate: the plan's chosen one.
  r = shardfit({"export-config", "--plan", plan, "--format", "deepspeed"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ds = nlohmann::json::parse(r.out);
  EXPECT_TRUE(ds["zero_optimization"]["stage"].is_number_integer());
  EXPECT_GT(ds["train_micro_batch_size_per_gpu"].get<int>(), 0);
  std::remove(plan.c_str());
}

TEST(ExportConfig, WhatTheTargetCannotExpressIsExitTwoWithOneLine) {
  const std::string plan = make_plan(2);
  // Two nodes for Accelerate: where machine_rank 0 listens is the user's to say.
  expect_bad_input({"export-config", "--plan", plan, "--candidate", "hybrid/fp32/wrap=block", "--format",
                    "accelerate"},
                   "--main-process-ip");
  expect_bad_input({"export-config", "--plan", plan, "--candidate", "hybrid/fp32/wrap=block", "--format",
                    "accelerate", "--main-process-ip", "10.0.0.1", "--main-process-port", "0"},
                   "not a TCP port");
  const Result r = shardfit({"export-config", "--plan", plan, "--candidate", "hybrid/fp32/wrap=block", "--format",
                             "accelerate", "--main-process-ip", "10.0.0.1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\nmain_process_ip: '10.0.0.1'\nmain_process_port: 29500\n"), std::string::npos) << r.out;
  expect_bad_input({"export-config", "--plan", plan, "--format", "megatron"}, "--format");
  expect_bad_input({"export-config", "--plan", plan, "--candidate", "zero3/fp32/wrap=size:7",
                    "--format", "fsdp"},
                   "--candidate");
  std::remove(plan.c_str());
  expect_bad_input({"export-config", "--plan", plan, "--format", "fsdp"}, plan);
}

}  // namespace
}  // namespace shardfit::cli_test
