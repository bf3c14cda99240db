// Plan JSON (SPEC's shardfit.plan/1): round trip, one-line errors naming the
// field, the choice by objective, and the printed table.
#include "planner/plan_output.h"
#include "planner/plan_text.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/support/error_of.h"
#include "tests/support/scratch_dir.h"

namespace shardfit::planner {
namespace {

using nlohmann::json;

using test_support::error_of;

PlanCandidate make(const std::string& id, int64_t max_batch, double tokens_per_s,
                   const std::string& limit) {
  PlanCandidate c;
  c.candidate = parse_candidate(id);
  c.max_batch_per_gpu = max_batch;
  c.predicted.peak_reserved_bytes = int64_t{22} << 30;
  c.predicted.peak_allocated_bytes = (int64_t{21} << 30) + 123;
  c.predicted.breakdown = {1, 2, 3, 4, 5, 6, 7};
  c.predicted.tokens_per_s = tokens_per_s;
  c.predicted.step_time_s = tokens_per_s > 0 ? 2048.0 / tokens_per_s : 0;
  c.predicted.peak_host_bytes = max_batch * 1000;
  c.predicted.compute_s = 0.5;
  c.predicted.offload_s = 0.25;
  c.limit = limit;
  c.units = 38;
  return c;
}

// The reference's GPT-2 Large table, with made-up speeds.
Plan sample_plan() {
  Plan plan;
  plan.model = {"gpt2-large", 774030080, 128};
  plan.hardware = {"titan-rtx-24gb", 25394413568, 2, 1};
  plan.candidates = {
      make("ddp/fp32/wrap=none", 7, 1000, "activations in step2/backward/transformer.h.35"),
      make("ddp/fp16/wrap=none", 7, 1900, "activations in step2/forward/transformer.h.30"),
      make("zero2/fp32/wrap=size:1000000", 11, 1400, "grads in step2/backward/transformer.h.2"),
      make("zero3/fp32/wrap=size:2000", 15, 1200, "activations in step2/backward/transformer.h.35"),
      make("zero3+offload/fp32/wrap=size:2000", 22, 600, "activations in step2/forward/lm_head"),
      make("ddp+ckpt/fp16/wrap=block", 0, 0, "params in init"),
  };
  plan.chosen = plan.candidates[*choose(plan.candidates, plan.objective)].id();
  return plan;
}

TEST(PlanOutputTest, WritesSpecFields) {
  json j = sample_plan();
  EXPECT_EQ(j["schema"], "shardfit.plan/1");
  EXPECT_EQ(j["model"]["params"], 774030080);
  EXPECT_EQ(j["hardware"]["gpus_per_node"], 2);
  const json& c = j["candidates"][4];
  EXPECT_EQ(c["id"], "zero3+offload/fp32/wrap=size:2000");
  EXPECT_EQ(c["sharding"], "zero3");
  EXPECT_EQ(c["offload"], true);
  EXPECT_EQ(c["activation_checkpointing"], false);
  EXPECT_EQ(c["precision"], "fp32");
  EXPECT_EQ(c["wrap"], "size:2000");
  EXPECT_EQ(c["max_batch_per_gpu"], 22);
  for (const char* key :
       {"params", "grads", "optimizer", "activations", "comm_buffers", "temporaries", "overhead"})
    EXPECT_TRUE(c["predicted"]["breakdown_bytes"].contains(key)) << key;
  for (const char* key :
       {"peak_reserved_bytes", "peak_allocated_bytes", "step_time_s", "tokens_per_s"})
    EXPECT_TRUE(c["predicted"].contains(key)) << key;
  EXPECT_EQ(c["limit"], "activations in step2/forward/lm_head");
  EXPECT_EQ(j["chosen"], "ddp/fp16/wrap=none");
}

TEST(PlanOutputTest, RoundTrips) {
  Plan plan = sample_plan();
  plan.objective = Objective::kBatch;
  plan.grad_accum = 4;  // `run --plan` and `validate` train with the plan's accumulation
  // What stopped a candidate, as PyTorch's OOM message would say it, and a
  // --stack pytorch plan's assumptions of the job.
  plan.candidates[5].oom = PlanCandidate::Oom{1, "init", 1000, 2 << 20, 5 << 20, 20 << 20};
  plan.stack = "pytorch";
  plan.single_gpu_unwrapped = true;
  plan.pytorch_job = Plan::PytorchJob{"1.13", "zero", "reentrant", 5 << 20, "post", 3, 2, "fp32", "fused", true, true};
  plan.candidates[5].adamw_step = "foreach";
  plan.hardware.allocator_budget_bytes = int64_t{22} << 30;
  std::string text = plan_to_json_text(plan);
  EXPECT_EQ(json::parse(text)["candidates"][5]["oom"]["allocation_bytes"], 2 << 20);
  EXPECT_EQ(json::parse(text)["pytorch_job"]["zero_grad"], "zero");
  Plan back = parse_plan(text);
  EXPECT_EQ(back.grad_accum, 4);
  EXPECT_EQ(plan_to_json_text(back), text);
  EXPECT_EQ(back.candidates.size(), 6u);
  EXPECT_EQ(back.candidates[0].predicted.peak_allocated_bytes, (int64_t{21} << 30) + 123);
  EXPECT_EQ(back.candidates[4].predicted.peak_host_bytes, 22000);
  EXPECT_EQ(back.objective, Objective::kBatch);
  ASSERT_TRUE(back.candidates[5].oom && back.pytorch_job);
  EXPECT_EQ(back.candidates[5].oom->reserved_bytes, 20 << 20);
  EXPECT_FALSE(back.candidates[0].oom);
  EXPECT_EQ(back.pytorch_job->fsdp_backward_prefetch, "post");
  EXPECT_EQ(back.pytorch_job->fsdp_version, 2);
  EXPECT_EQ(back.pytorch_job->fsdp_reduce_dtype, "fp32");
  EXPECT_TRUE(back.pytorch_job->fsdp_keep_low_precision_grads);
  EXPECT_TRUE(back.pytorch_job->fsdp_use_orig_params);
  EXPECT_EQ(back.pytorch_job->torch, "1.13");
  // The AdamW step: the job's --adamw-step and each candidate's; a reader
  // older than adamw_step finds adamw_foreach (true only for foreach).
  EXPECT_EQ(back.pytorch_job->adamw_step, "fused");
  EXPECT_EQ(back.candidates[5].adamw_step, "foreach");
  EXPECT_EQ(back.candidates[0].adamw_step, "");
  EXPECT_EQ(json::parse(text)["pytorch_job"]["adamw_foreach"], false);
  EXPECT_EQ(json::parse(text)["candidates"][5]["adamw_foreach"], true);
  {
    // A plan from before adamw_step: adamw_foreach read as the step.
    json before = json::parse(text);
    before["pytorch_job"].erase("adamw_step");
    before["pytorch_job"]["adamw_foreach"] = true;
    before["candidates"][5].erase("adamw_step");
    before["candidates"][5]["adamw_foreach"] = false;
    const Plan read = parse_plan(before.dump());
    EXPECT_EQ(read.pytorch_job->adamw_step, "foreach");
    EXPECT_EQ(read.candidates[5].adamw_step, "for-loop");
    before["candidates"][5]["adamw_step"] = "fast";
    EXPECT_THROW(parse_plan(before.dump()), std::invalid_argument);
  }
  // An older plan has no fsdp_version: FSDP1; an unknown one is refused.
  // Nor a torch version: none is assumed; one no plan makes is refused.
  json older = json::parse(text);
  older["pytorch_job"]["torch"] = "1.12";
  EXPECT_THROW(parse_plan(older.dump()), std::invalid_argument);
  older["pytorch_job"].erase("torch");
  EXPECT_EQ(parse_plan(older.dump()).pytorch_job->torch, "");
  older["pytorch_job"].erase("fsdp_version");
  older["pytorch_job"].erase("fsdp_reduce_dtype");
  older["pytorch_job"].erase("fsdp_keep_low_precision_grads");
  older["pytorch_job"].erase("fsdp_use_orig_params");
  EXPECT_EQ(parse_plan(older.dump()).pytorch_job->fsdp_version, 1);
  EXPECT_EQ(parse_plan(older.dump()).pytorch_job->fsdp_reduce_dtype, "param");
  EXPECT_FALSE(parse_plan(older.dump()).pytorch_job->fsdp_keep_low_precision_grads);
  EXPECT_FALSE(parse_plan(older.dump()).pytorch_job->fsdp_use_orig_params);
  older["pytorch_job"]["fsdp_version"] = 3;
  EXPECT_THROW(parse_plan(older.dump()), std::invalid_argument);
  // reduce_dtype: param_dtype's or one named; nothing else.
  older["pytorch_job"]["fsdp_version"] = 1;
  older["pytorch_job"]["fsdp_reduce_dtype"] = "bf16";
  EXPECT_EQ(parse_plan(older.dump()).pytorch_job->fsdp_reduce_dtype, "bf16");
  older["pytorch_job"]["fsdp_reduce_dtype"] = "int8";
  EXPECT_THROW(parse_plan(older.dump()), std::invalid_argument);
  EXPECT_TRUE(back.single_gpu_unwrapped);
  EXPECT_EQ(back.hardware.allocator_budget_bytes, int64_t{22} << 30);

  // Through a file, and through nlohmann's ADL.
  std::string path = shardfit::test_support::scratch_root().string() + "/plan.json";
  write_plan_file(path, plan);
  EXPECT_EQ(plan_to_json_text(read_plan_file(path)), text);
  Plan via_adl = json::parse(text).get<Plan>();
  EXPECT_EQ(via_adl.chosen, plan.chosen);
}

TEST(PlanOutputTest, ReadsAPlanWithOnlySpecFields) {
  json j = sample_plan();
  j.erase("optimizer");
  j.erase("objective");
  j.erase("grad_accum");
  for (json& c : j["candidates"]) {
    c.erase("units");
    c["predicted"].erase("peak_host_bytes");
    c["predicted"].erase("time_breakdown_s");
  }
  Plan plan = parse_plan(j.dump());
  EXPECT_EQ(plan.objective, Objective::kThroughput);
  EXPECT_EQ(plan.grad_accum, 1);
  EXPECT_EQ(plan.candidates[0].units, 0);
  // No fit at all is spelled null.
  j["chosen"] = nullptr;
  EXPECT_EQ(parse_plan(j.dump()).chosen, "");
}

TEST(PlanOutputTest, ErrorsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["schema"] = "shardfit.report/1"; }, "'schema'"},
      {[](json& j) { j.erase("schema"); }, "'schema' is missing"},
      {[](json& j) { j["model"].erase("seq_len"); }, "'model.seq_len' is missing"},
      {[](json& j) { j["hardware"]["nodes"] = 0; }, "'hardware.nodes' must be >= 1"},
      // A field that carries a job's option meets the option's one rule (spec/job.h).
      {[](json& j) { j["hardware"]["nodes"] = 70000; }, "'hardware.nodes' fails --nodes 70000: at most 65536"},
      {[](json& j) { j["hardware"]["gpus_per_node"] = 2000; },
       "'hardware.gpus_per_node' fails --gpus 2000: at most 1024"},
      {[](json& j) { j["grad_accum"] = 5000; }, "'grad_accum' fails --grad-accum 5000: at most 4096"},
      {[](json& j) { j["candidates"][2]["predicted"]["step_time_s"] = "fast"; },
       "'candidates[2].predicted.step_time_s' must be a number"},
      {[](json& j) { j["candidates"][1]["predicted"]["breakdown_bytes"].erase("grads"); },
       "'candidates[1].predicted.breakdown_bytes.grads' is missing"},
      {[](json& j) { j["candidates"][0]["max_batch_per_gpu"] = -1; },
       "'candidates[0].max_batch_per_gpu'"},
      {[](json& j) { j["candidates"][0]["id"] = "ddp/fp64/wrap=none"; }, "'candidates[0].id'"},
      {[](json& j) { j["candidates"][3]["sharding"] = "zero2"; }, "'candidates[3].sharding'"},
      {[](json& j) { j["candidates"][3]["offload"] = true; }, "'candidates[3].offload'"},
      {[](json& j) { j["candidates"][3]["wrap"] = "block"; }, "'candidates[3].wrap'"},
      {[](json& j) { j["candidates"][1] = j["candidates"][0]; }, "'candidates[1].id' repeats"},
      {[](json& j) { j["chosen"] = "zero3/bf16/wrap=block"; }, "'chosen'"},
      {[](json& j) { j["chosen"] = 3; }, "'chosen'"},
      {[](json& j) { j["objective"] = "speed"; }, "'objective'"},
      {[](json& j) { j["candidates"] = json::object(); }, "'candidates' must be an array"},
  };
  for (const Case& k : cases) {
    json j = sample_plan();
    k.edit(j);
    std::string err = error_of([&] { parse_plan(j.dump(), "plan file p.json"); });
    EXPECT_NE(err.find(k.expect), std::string::npos) << err;
    EXPECT_NE(err.find("plan file p.json"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

TEST(PlanOutputTest, MalformedJsonAndMissingFiles) {
  std::string err = error_of([] { parse_plan("{\"schema\":", "plan file x.json"); });
  EXPECT_NE(err.find("x.json"), std::string::npos) << err;
  EXPECT_NE(err.find("malformed JSON"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  err = error_of([] { read_plan_file("/nonexistent/plan.json"); });
  EXPECT_NE(err.find("/nonexistent/plan.json"), std::string::npos) << err;
  err = error_of([] { write_plan_file("/nonexistent/plan.json", Plan{}); });
  EXPECT_NE(err.find("/nonexistent/plan.json"), std::string::npos) << err;
}

TEST(PlanOutputTest, ChoosesByThroughput) {
  Plan plan = sample_plan();
  EXPECT_EQ(plan.candidates[*choose(plan.candidates, Objective::kThroughput)].id(),
            "ddp/fp16/wrap=none");
  // A tie on tokens/s goes to the larger batch.
  plan.candidates[3].predicted.tokens_per_s = 1900;
  EXPECT_EQ(*choose(plan.candidates, Objective::kThroughput), 3u);
  // What does not fit batch 1 is never chosen, however fast it claims to be.
  plan.candidates[5].predicted.tokens_per_s = 1e9;
  EXPECT_NE(*choose(plan.candidates, Objective::kThroughput), 5u);
}

TEST(PlanOutputTest, ChoosesByBatch) {
  Plan plan = sample_plan();
  EXPECT_EQ(plan.candidates[*choose(plan.candidates, Objective::kBatch)].id(),
            "zero3+offload/fp32/wrap=size:2000");
  // A tie on batch goes to the higher tokens/s.
  plan.candidates[3].max_batch_per_gpu = 22;
  plan.candidates[3].predicted.tokens_per_s = 601;
  EXPECT_EQ(*choose(plan.candidates, Objective::kBatch), 3u);
}

TEST(PlanOutputTest, NothingFitsNothingChosen) {
  std::vector<PlanCandidate> none = {make("ddp/fp32/wrap=none", 0, 0, "params in init")};
  EXPECT_FALSE(choose(none, Objective::kThroughput).has_value());
  EXPECT_FALSE(choose(none, Objective::kBatch).has_value());
  EXPECT_FALSE(choose({}, Objective::kBatch).has_value());
}

TEST(PlanOutputTest, FindsCandidatesByAnySpelling) {
  Plan plan = sample_plan();
  ASSERT_NE(plan.find("full_shard/fp32/wrap=size:2000"), nullptr);
  EXPECT_EQ(plan.find("full_shard/fp32/wrap=size:2000")->max_batch_per_gpu, 15);
  EXPECT_EQ(plan.find("zero1/fp32/wrap=none"), nullptr);
  EXPECT_EQ(plan.find("garbage"), nullptr);
}

TEST(PlanOutputTest, TableListsEveryCandidateAndMarksTheChosen) {
  Plan plan = sample_plan();
  std::string table = format_plan_table(plan);
  std::vector<std::string> lines;
  for (size_t b = 0, e; b < table.size(); b = e + 1) {
    e = table.find('\n', b);
    lines.push_back(table.substr(b, e - b));
  }
  // Header, column titles, 6 rows, footer.
  ASSERT_EQ(lines.size(), 9u) << table;
  EXPECT_NE(lines[0].find("gpt2-large"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("seq len 128"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("2 GPUs x titan-rtx-24gb"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("23.65 GiB"), std::string::npos) << lines[0];
  // A CUDA profile's fixed overheads leave the allocator less: the header
  // says how much.
  plan.hardware.allocator_budget_bytes = int64_t{22} << 30;
  const std::string with_budget = format_plan_table(plan);
  EXPECT_NE(with_budget.find("memory 23.65 GiB per GPU, 22.00 GiB of it the allocator's"), std::string::npos)
      << with_budget;
  for (const PlanCandidate& c : plan.candidates)
    EXPECT_NE(table.find(c.id()), std::string::npos) << c.id();
  // Sorted by max batch, then tokens/s: offload (22) first, the unfit last.
  EXPECT_NE(lines[2].find("zero3+offload/fp32/wrap=size:2000"), std::string::npos) << table;
  EXPECT_NE(lines[7].find("ddp+ckpt/fp16/wrap=block"), std::string::npos) << table;
  // ddp fp16 (7, faster) before ddp fp32 (7): the chosen row, marked.
  EXPECT_EQ(lines[5][0], '*') << table;
  EXPECT_NE(lines[5].find("ddp/fp16/wrap=none"), std::string::npos) << table;
  int marked = 0;
  for (size_t i = 2; i < 8; ++i) marked += lines[i][0] == '*';
  EXPECT_EQ(marked, 1) << table;
  // Fixed width: every row's id column starts at the same place, sizes in GiB.
  EXPECT_EQ(lines[2].find("zero3"), lines[3].find("zero3"));
  EXPECT_NE(table.find("22.00"), std::string::npos) << table;
  EXPECT_NE(table.find("activations in step2/backward/transformer.h.35"), std::string::npos);
  EXPECT_NE(lines[8].find("chosen: ddp/fp16/wrap=none"), std::string::npos) << lines[8];
}

TEST(PlanOutputTest, TableSaysWhenNothingFits) {
  Plan plan;
  plan.model = {"gpt2-xl", 1557611200, 128};
  plan.hardware = {"titan-rtx-24gb", 25394413568, 1, 1};
  plan.candidates = {make("ddp/fp32/wrap=none", 0, 0, "optimizer in step1/optimizer")};
  std::string table = format_plan_table(plan);
  EXPECT_NE(table.find("1 GPU x titan-rtx-24gb"), std::string::npos) << table;
  EXPECT_NE(table.find("no candidate fits"), std::string::npos) << table;
  EXPECT_EQ(table.find('*'), std::string::npos) << table;
}

}  // namespace
}  // namespace shardfit::planner
