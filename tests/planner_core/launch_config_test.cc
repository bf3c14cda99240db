// export-config's mapping (planner/launch_config.h): each target's keys and
// value types as its documentation defines them, and the candidates a
// target cannot express refused with one line.
//  - FSDP: torch.distributed.fsdp.FullyShardedDataParallel's keyword
//    arguments (https://pytorch.org/docs/stable/fsdp.html); ddp and zero1 as
//    DistributedDataParallel and ZeroRedundancyOptimizer.
//  - Python: the same as a module (what it does when run:
//    tests/pytorch/export_config_test.py).
//  - Accelerate: `accelerate launch --config_file` YAML with fsdp_config
//    (https://huggingface.co/docs/accelerate/usage_guides/fsdp).
//  - DeepSpeed: ds_config.json (https://www.deepspeed.ai/docs/config-json/).
#include "planner/launch_config.h"

#include <gtest/gtest.h>

#include <string>

namespace shardfit::planner {
namespace {

using ojson = nlohmann::ordered_json;

Plan plan_with(const std::string& id, int64_t max_batch, int gpus = 2, int nodes = 1) {
  Plan plan;
  plan.model = {"gpt2-large", 774030080, 128};
  plan.hardware = {"titan-rtx-24gb", 25394413568, gpus, nodes};
  PlanCandidate c;
  c.candidate = parse_candidate(id);
  c.max_batch_per_gpu = max_batch;
  plan.candidates.push_back(c);
  plan.chosen = c.id();
  return plan;
}

LaunchConfig export_one(const std::string& id, LaunchFormat f, int64_t batch = 39, int nodes = 1,
                        int grad_accum = 1) {
  Plan plan = plan_with(id, batch, 2, nodes);
  plan.grad_accum = grad_accum;
  LaunchOptions options;
  options.block_class = "GPT2Block";
  if (nodes > 1) options.main_process_ip = "10.0.0.1";
  return export_launch_config(plan, plan.candidates[0], f, options);
}

std::string all_notes(const LaunchConfig& c) {
  std::string all;
  for (const std::string& n : c.notes) all += n + "\n";
  return all;
}

std::string refusal(const std::string& id, LaunchFormat f, int nodes = 1) {
  try {
    export_one(id, f, 8, nodes);
  } catch (const InexpressibleCandidate& e) {
    return e.what();
  }
  ADD_FAILURE() << id << " was not refused";
  return "";
}

TEST(LaunchConfig, FormatNames) {
  EXPECT_EQ(parse_launch_format("fsdp"), LaunchFormat::kFsdp);
  EXPECT_EQ(parse_launch_format("accelerate"), LaunchFormat::kAccelerate);
  EXPECT_EQ(parse_launch_format("deepspeed"), LaunchFormat::kDeepSpeed);
  EXPECT_EQ(parse_launch_format("python"), LaunchFormat::kPython);
  EXPECT_THROW(parse_launch_format("megatron"), std::invalid_argument);
}

TEST(LaunchConfig, FsdpKwargsHaveTheConstructorsNamesAndTypes) {
  const LaunchConfig c = export_one("zero3+offload/fp32/wrap=size:2000", LaunchFormat::kFsdp);
  const ojson parsed = ojson::parse(c.text);  // the text is the JSON
  EXPECT_EQ(parsed, c.settings);
  const ojson& k = parsed.at("fsdp_kwargs");
  // ShardingStrategy member names.
  EXPECT_EQ(k.at("sharding_strategy"), "FULL_SHARD");
  // size_based_auto_wrap_policy(min_num_params=int).
  EXPECT_EQ(k.at("auto_wrap_policy").at("policy"), "size_based_auto_wrap_policy");
  ASSERT_TRUE(k.at("auto_wrap_policy").at("min_num_params").is_number_integer());
  EXPECT_EQ(k.at("auto_wrap_policy").at("min_num_params"), 2000);
  // CPUOffload(offload_params: bool).
  ASSERT_TRUE(k.at("cpu_offload").at("offload_params").is_boolean());
  EXPECT_TRUE(k.at("cpu_offload").at("offload_params").get<bool>());
  EXPECT_TRUE(k.at("mixed_precision").is_null());        // fp32: no MixedPrecision
  EXPECT_EQ(k.at("backward_prefetch"), "BACKWARD_PRE");  // a BackwardPrefetch member
  ASSERT_TRUE(k.at("limit_all_gathers").is_boolean());
  EXPECT_EQ(k.at("forward_prefetch"), false);  // --prefetch 1: backward only
  EXPECT_EQ(k.at("sync_module_states"), true);
  EXPECT_EQ(k.at("use_orig_params"), false);  // the FlatParameters the plan simulated
  EXPECT_TRUE(k.at("device_id").is_string());
  EXPECT_FALSE(parsed.at("activation_checkpointing").at("enabled").get<bool>());
  EXPECT_EQ(parsed.at("train").at("batch_size_per_gpu"), 39);
  EXPECT_EQ(parsed.at("train").at("world_size"), 2);
}

TEST(LaunchConfig, PrefetchTwoPrefetchesInForwardToo) {
  Plan plan = plan_with("zero3/bf16/wrap=block", 8);
  plan.schedule.prefetch = 2;
  EXPECT_EQ(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                .settings["fsdp_kwargs"]["forward_prefetch"],
            true);
  EXPECT_EQ(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block")
                .settings["fsdp_config"]["fsdp_forward_prefetch"],
            true);
}

TEST(LaunchConfig, FsdpMapsEveryShardingWrapPrecisionAndCheckpointing) {
  // ddp and zero1: DistributedDataParallel, with ZeroRedundancyOptimizer
  // (PyTorch's ZeRO-1) for zero1.
  const LaunchConfig ddp = export_one("ddp/fp32/wrap=none", LaunchFormat::kFsdp);
  EXPECT_FALSE(ddp.settings.contains("fsdp_kwargs"));
  EXPECT_EQ(ddp.settings["ddp_kwargs"]["bucket_cap_mb"], 25.0);
  EXPECT_FALSE(ddp.settings.contains("optimizer"));
  EXPECT_EQ(export_one("zero1/bf16/wrap=none", LaunchFormat::kFsdp).settings["optimizer"]["class"],
            "torch.distributed.optim.ZeroRedundancyOptimizer");
  EXPECT_EQ(export_one("zero2/fp32/wrap=block", LaunchFormat::kFsdp)
                .settings["fsdp_kwargs"]["sharding_strategy"],
            "SHARD_GRAD_OP");
  EXPECT_EQ(export_one("hybrid/fp32/wrap=block", LaunchFormat::kFsdp, 8, 2)
                .settings["fsdp_kwargs"]["sharding_strategy"],
            "HYBRID_SHARD");
  EXPECT_EQ(export_one("hybrid/fp32/wrap=block", LaunchFormat::kFsdp, 8, 2)
                .settings["fsdp_kwargs"]["device_mesh"]["shape"],
            ojson::array({2, 2}));
  EXPECT_TRUE(export_one("zero3/fp32/wrap=none", LaunchFormat::kFsdp)
                  .settings["fsdp_kwargs"]["auto_wrap_policy"]
                  .is_null());
  const LaunchConfig c = export_one("zero3+ckpt/bf16/wrap=block", LaunchFormat::kFsdp);
  const ojson& wrap = c.settings["fsdp_kwargs"]["auto_wrap_policy"];
  EXPECT_EQ(wrap["policy"], "transformer_auto_wrap_policy");
  EXPECT_EQ(wrap["transformer_layer_cls"], ojson::array({"GPT2Block"}));
  const ojson& mp = c.settings["fsdp_kwargs"]["mixed_precision"];
  EXPECT_EQ(mp["param_dtype"], "bfloat16");
  EXPECT_EQ(mp["reduce_dtype"], "bfloat16");
  EXPECT_EQ(mp["buffer_dtype"], "bfloat16");
  const ojson& ckpt = c.settings["activation_checkpointing"];
  EXPECT_TRUE(ckpt["enabled"].get<bool>());
  EXPECT_EQ(ckpt["function"], "apply_activation_checkpointing");
  EXPECT_EQ(ckpt["auto_wrap_policy"], wrap);  // the same units are checkpointed
  EXPECT_EQ(export_one("zero3/fp16/wrap=block", LaunchFormat::kFsdp)
                .settings["fsdp_kwargs"]["mixed_precision"]["param_dtype"],
            "float16");
}

// A --stack pytorch plan for FSDP1 exports what it simulated: its
// MixedPrecision's reduce_dtype and keep_low_precision_grads, its
// BackwardPrefetch (None: Accelerate's NO_PREFETCH).
TEST(LaunchConfig, AnFsdp1PlanExportsTheJobItSimulated) {
  Plan plan = plan_with("zero3/bf16/wrap=block", 12, 2, 1);
  plan.stack = "pytorch";
  plan.pytorch_job = Plan::PytorchJob{"2.11", "none", "non-reentrant", 25 << 20, "post", 2, 1, "fp32", "", true};
  const LaunchConfig f = export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block");
  const ojson& k = f.settings["fsdp_kwargs"];
  EXPECT_EQ(k["mixed_precision"], ojson({{"param_dtype", "bfloat16"},
                                         {"reduce_dtype", "float32"},
                                         {"buffer_dtype", "bfloat16"},
                                         {"keep_low_precision_grads", true}}));
  EXPECT_EQ(k["backward_prefetch"], "BACKWARD_POST");
  EXPECT_THROW(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block"),
               InexpressibleCandidate);
  plan.pytorch_job->fsdp_reduce_dtype = "param";
  plan.pytorch_job->fsdp_keep_low_precision_grads = false;
  plan.pytorch_job->fsdp_backward_prefetch = "none";
  EXPECT_TRUE(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                  .settings["fsdp_kwargs"]["backward_prefetch"]
                  .is_null());
  EXPECT_EQ(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block")
                .settings["fsdp_config"]["fsdp_backward_prefetch"],
            "NO_PREFETCH");
  // fp32 parameters reduced in bf16: MixedPrecision(reduce_dtype=bfloat16)
  // alone, which Accelerate cannot say; reduced in fp32, no MixedPrecision.
  Plan fp32 = plan_with("zero3/fp32/wrap=block", 12, 2, 1);
  fp32.stack = "pytorch";
  fp32.pytorch_job = plan.pytorch_job;
  fp32.pytorch_job->fsdp_reduce_dtype = "bf16";
  EXPECT_EQ(export_launch_config(fp32, fp32.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                .settings["fsdp_kwargs"]["mixed_precision"],
            ojson({{"reduce_dtype", "bfloat16"}}));
  EXPECT_THROW(export_launch_config(fp32, fp32.candidates[0], LaunchFormat::kAccelerate, "GPT2Block"),
               InexpressibleCandidate);
  fp32.pytorch_job->fsdp_reduce_dtype = "fp32";
  EXPECT_TRUE(export_launch_config(fp32, fp32.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                  .settings["fsdp_kwargs"]["mixed_precision"]
                  .is_null());
  EXPECT_NO_THROW(export_launch_config(fp32, fp32.candidates[0], LaunchFormat::kAccelerate, "GPT2Block"));
}

// Under --stack pytorch a ddp candidate with an auto wrap policy is FSDP1's
// NO_SHARD, as planned; the engine's ddp candidates stay
// DistributedDataParallel whatever their wrap (it names what +ckpt
// checkpoints).
TEST(LaunchConfig, APytorchDdpCandidateWithAWrapPolicyExportsNoShard) {
  Plan plan = plan_with("ddp+offload/fp32/wrap=size:2000", 12, 2, 1);
  plan.stack = "pytorch";
  plan.pytorch_job = Plan::PytorchJob{"2.11", "none", "non-reentrant", 25 << 20, "pre", 2, 1, "param", "", false};
  const LaunchConfig f = export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block");
  EXPECT_EQ(f.settings["fsdp_kwargs"]["sharding_strategy"], "NO_SHARD");
  EXPECT_EQ(f.settings["fsdp_kwargs"]["cpu_offload"], ojson({{"offload_params", true}}));
  const LaunchConfig a = export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block");
  EXPECT_EQ(a.settings["distributed_type"], "FSDP");
  EXPECT_EQ(a.settings["fsdp_config"]["fsdp_sharding_strategy"], "NO_SHARD");
  const LaunchConfig py = export_launch_config(plan, plan.candidates[0], LaunchFormat::kPython, "GPT2Block");
  EXPECT_EQ(py.settings["module"], "fsdp1");
  EXPECT_NE(py.text.find("ShardingStrategy.NO_SHARD"), std::string::npos);
  EXPECT_NE(py.text.find("use_orig_params=False"), std::string::npos);
  // --fsdp-use-orig-params: what the plan simulated, in every format.
  plan.pytorch_job->fsdp_use_orig_params = true;
  EXPECT_EQ(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                .settings["fsdp_kwargs"]["use_orig_params"],
            true);
  EXPECT_EQ(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block")
                .settings["fsdp_config"]["fsdp_use_orig_params"],
            true);
  EXPECT_NE(export_launch_config(plan, plan.candidates[0], LaunchFormat::kPython, "GPT2Block")
                .text.find("use_orig_params=True"),
            std::string::npos);
  Plan engine = plan_with("ddp+ckpt/fp32/wrap=block", 12, 2, 1);
  EXPECT_EQ(export_launch_config(engine, engine.candidates[0], LaunchFormat::kPython, "GPT2Block").settings["module"],
            "ddp");
  EXPECT_EQ(export_launch_config(engine, engine.candidates[0], LaunchFormat::kAccelerate, "GPT2Block")
                .settings["distributed_type"],
            "MULTI_GPU");
}

TEST(LaunchConfig, AccelerateYamlHasFsdpConfigKeys) {
  const LaunchConfig c = export_one("zero3+offload/bf16/wrap=size:2000", LaunchFormat::kAccelerate);
  const ojson& s = c.settings;
  EXPECT_EQ(s["distributed_type"], "FSDP");
  EXPECT_FALSE(s.contains("main_process_ip"));  // one node
  ASSERT_TRUE(s["num_processes"].is_number_integer());
  EXPECT_EQ(s["num_processes"], 2);
  ASSERT_TRUE(s["num_machines"].is_number_integer());
  EXPECT_EQ(s["num_machines"], 1);
  EXPECT_EQ(s["mixed_precision"], "bf16");
  const ojson& f = s["fsdp_config"];
  // FSDP1: the current key and the one Accelerate 1.15's launch applies.
  EXPECT_EQ(f["fsdp_version"], 1);
  EXPECT_EQ(f["fsdp_reshard_after_forward"], "FULL_SHARD");
  EXPECT_EQ(f["fsdp_sharding_strategy"], "FULL_SHARD");
  EXPECT_EQ(f["fsdp_use_orig_params"], false);
  EXPECT_EQ(f["fsdp_auto_wrap_policy"], "SIZE_BASED_WRAP");
  ASSERT_TRUE(f["fsdp_min_num_params"].is_number_integer());
  EXPECT_EQ(f["fsdp_min_num_params"], 2000);
  ASSERT_TRUE(f["fsdp_offload_params"].is_boolean());
  EXPECT_TRUE(f["fsdp_offload_params"].get<bool>());
  EXPECT_EQ(f["fsdp_backward_prefetch"], "BACKWARD_PRE");
  ASSERT_TRUE(f["fsdp_activation_checkpointing"].is_boolean());
  // The YAML says the same.
  EXPECT_NE(c.text.find("\ndistributed_type: FSDP\n"), std::string::npos) << c.text;
  EXPECT_NE(c.text.find("\nfsdp_config:\n  fsdp_version: 1\n  fsdp_reshard_after_forward: FULL_SHARD\n"),
            std::string::npos)
      << c.text;
  EXPECT_NE(c.text.find("\n  fsdp_min_num_params: 2000\n"), std::string::npos);
  EXPECT_NE(c.text.find("\n  fsdp_offload_params: true\n"), std::string::npos);
  EXPECT_NE(c.text.find("\nnum_processes: 2\n"), std::string::npos);
  EXPECT_NE(c.text.find("\nmixed_precision: bf16\n"), std::string::npos);
}

// A plan made for FSDP2 (plan --stack pytorch --fsdp-version 2) exports
// fully_shard's arguments and Accelerate's fsdp_version 2 keys, not FSDP1's.
TEST(LaunchConfig, AnFsdp2PlanExportsFullyShard) {
  Plan plan = plan_with("zero2+offload/bf16/wrap=block", 12, 2, 1);
  plan.stack = "pytorch";
  plan.pytorch_job = Plan::PytorchJob{"2.11", "none", "non-reentrant", 25 << 20, "pre", 2, 2, "fp32"};
  const LaunchConfig f = export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block");
  EXPECT_EQ(ojson::parse(f.text), f.settings);
  EXPECT_FALSE(f.settings.contains("fsdp_kwargs"));
  const ojson& k = f.settings["fully_shard_kwargs"];
  EXPECT_FALSE(k["reshard_after_forward"].get<bool>());  // zero2
  EXPECT_EQ(k["mp_policy"], ojson({{"param_dtype", "bfloat16"}, {"reduce_dtype", "float32"}}));
  EXPECT_EQ(k["offload_policy"], "CPUOffloadPolicy");
  // No policy is left out, never null: fully_shard reads mp_policy.param_dtype.
  Plan fp32 = plan_with("zero3/fp32/wrap=block", 12, 2, 1);
  fp32.stack = "pytorch";
  fp32.pytorch_job = plan.pytorch_job;
  fp32.pytorch_job->fsdp_reduce_dtype = "param";
  const ojson k32 = export_launch_config(fp32, fp32.candidates[0], LaunchFormat::kFsdp, "GPT2Block")
                        .settings["fully_shard_kwargs"];
  EXPECT_FALSE(k32.contains("mp_policy"));
  EXPECT_FALSE(k32.contains("offload_policy"));
  EXPECT_EQ(f.settings["fully_shard_modules"], ojson::array({"every GPT2Block", "the root"}));
  EXPECT_EQ(f.settings["train"]["batch_size_per_gpu"], 12);
  // The optimizer the plan simulated is named, so that the job builds it.
  auto notes = [](const LaunchConfig& c) {
    std::string all;
    for (const std::string& n : c.notes) all += n + "\n";
    return all;
  };
  EXPECT_NE(notes(f).find("AdamW(foreach=False)"), std::string::npos) << notes(f);
  plan.pytorch_job->adamw_step = "foreach";
  EXPECT_NE(notes(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block"))
                .find("AdamW(foreach=True)"),
            std::string::npos);
  plan.pytorch_job->adamw_step = "fused";
  EXPECT_NE(notes(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block"))
                .find("AdamW(fused=True)"),
            std::string::npos);
  plan.pytorch_job->adamw_step = "foreach";
  plan.pytorch_job->fsdp_version = 1;
  EXPECT_NE(notes(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block"))
                .find("AdamW(foreach=True)"),
            std::string::npos);
  plan.pytorch_job->fsdp_version = 2;
  plan.pytorch_job->adamw_step = "";
  // Accelerate's mixed_precision casts every dtype alike: reduce_dtype
  // float32 is not its to say, and is refused rather than dropped.
  EXPECT_THROW(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block"),
               InexpressibleCandidate);
  plan.pytorch_job->fsdp_reduce_dtype = "param";
  const LaunchConfig a = export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block");
  const ojson& c = a.settings["fsdp_config"];
  EXPECT_EQ(c["fsdp_version"], 2);
  EXPECT_FALSE(c["fsdp_reshard_after_forward"].get<bool>());
  EXPECT_FALSE(c.contains("fsdp_sharding_strategy"));
  EXPECT_FALSE(c.contains("fsdp_backward_prefetch"));
  EXPECT_NE(a.text.find("\n  fsdp_version: 2\n"), std::string::npos) << a.text;
  // HSDP: fully_shard over a 2-D mesh; Accelerate's FSDP2 keys cannot say it.
  Plan hybrid = plan_with("hybrid/fp32/wrap=block", 12, 4, 2);
  hybrid.stack = "pytorch";
  hybrid.pytorch_job = plan.pytorch_job;
  const LaunchConfig h = export_launch_config(hybrid, hybrid.candidates[0], LaunchFormat::kFsdp, "GPT2Block");
  EXPECT_TRUE(h.settings["fully_shard_kwargs"]["reshard_after_forward"].get<bool>());
  EXPECT_EQ(h.settings["fully_shard_kwargs"]["mesh"]["shape"], ojson::array({2, 4}));
  LaunchOptions two_nodes;
  two_nodes.block_class = "GPT2Block";
  two_nodes.main_process_ip = "10.0.0.1";
  EXPECT_THROW(export_launch_config(hybrid, hybrid.candidates[0], LaunchFormat::kAccelerate, two_nodes),
               InexpressibleCandidate);
  // --prefetch 2 under FSDP2: explicit prefetching, as simulated (one block
  // ahead, two back); Accelerate has no key for it.
  EXPECT_FALSE(f.settings.contains("forward_prefetch_blocks"));
  plan.schedule.prefetch = 2;
  const LaunchConfig p = export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, "GPT2Block");
  EXPECT_EQ(p.settings["forward_prefetch_blocks"], 1);
  EXPECT_EQ(p.settings["backward_prefetch_blocks"], 2);
  EXPECT_NE(notes(p).find("set_modules_to_forward_prefetch(blocks[i+1 : i+2])"), std::string::npos) << notes(p);
  EXPECT_THROW(export_launch_config(plan, plan.candidates[0], LaunchFormat::kAccelerate, "GPT2Block"),
               InexpressibleCandidate);
}

TEST(LaunchConfig, AccelerateBlockWrapNamesTheLayerClassAndFp32IsQuotedNo) {
  const LaunchConfig c = export_one("zero2+ckpt/fp32/wrap=block", LaunchFormat::kAccelerate, 8, 2);
  EXPECT_EQ(c.settings["main_process_ip"], "10.0.0.1");  // two nodes: where machine_rank 0 listens
  EXPECT_EQ(c.settings["main_process_port"], 29500);
  EXPECT_EQ(c.settings["fsdp_config"]["fsdp_auto_wrap_policy"], "TRANSFORMER_BASED_WRAP");
  EXPECT_EQ(c.settings["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"], "GPT2Block");
  EXPECT_TRUE(c.settings["fsdp_config"]["fsdp_activation_checkpointing"].get<bool>());
  EXPECT_EQ(c.settings["num_processes"], 4);  // every process, all machines
  EXPECT_EQ(c.settings["num_machines"], 2);
  // YAML would read a bare `no` as false.
  EXPECT_NE(c.text.find("\nmixed_precision: 'no'\n"), std::string::npos) << c.text;
}

// ddp is Accelerate's MULTI_GPU (DistributedDataParallel), not FSDP's
// NO_SHARD; zero1, which FSDP cannot say, its DeepSpeed integration.
TEST(LaunchConfig, AccelerateDdpIsMultiGpuAndZero1IsDeepSpeed) {
  const LaunchConfig ddp = export_one("ddp/bf16/wrap=none", LaunchFormat::kAccelerate);
  EXPECT_EQ(ddp.settings["distributed_type"], "MULTI_GPU");
  EXPECT_FALSE(ddp.settings.contains("fsdp_config"));
  Plan one = plan_with("ddp/fp32/wrap=none", 8, 1, 1);
  EXPECT_EQ(export_launch_config(one, one.candidates[0], LaunchFormat::kAccelerate, "")
                .settings["distributed_type"],
            "NO");
  const LaunchConfig z1 = export_one("zero1+offload/bf16/wrap=none", LaunchFormat::kAccelerate, 8, 1, 2);
  EXPECT_EQ(z1.settings["distributed_type"], "DEEPSPEED");
  EXPECT_EQ(z1.settings["deepspeed_config"]["zero_stage"], 1);
  EXPECT_EQ(z1.settings["deepspeed_config"]["offload_optimizer_device"], "cpu");
  EXPECT_EQ(z1.settings["deepspeed_config"]["gradient_accumulation_steps"], 2);
  EXPECT_NE(z1.text.find("\ndistributed_type: DEEPSPEED\n"), std::string::npos) << z1.text;
}

TEST(LaunchConfig, DeepSpeedConfigHasZeroStageOffloadBatchAndPrecision) {
  const LaunchConfig c =
      export_one("zero3+offload/bf16/wrap=size:2000", LaunchFormat::kDeepSpeed, 39, 1, 4);
  const ojson s = ojson::parse(c.text);
  ASSERT_TRUE(s["train_micro_batch_size_per_gpu"].is_number_integer());
  EXPECT_EQ(s["train_micro_batch_size_per_gpu"], 39);
  EXPECT_EQ(s["gradient_accumulation_steps"], 4);
  EXPECT_EQ(s["train_batch_size"], 39 * 4 * 2);  // micro × accumulation × world
  ASSERT_TRUE(s["zero_optimization"]["stage"].is_number_integer());
  EXPECT_EQ(s["zero_optimization"]["stage"], 3);
  EXPECT_EQ(s["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(s["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  ASSERT_TRUE(s["zero_optimization"]["offload_optimizer"]["pin_memory"].is_boolean());
  ASSERT_TRUE(s["bf16"]["enabled"].is_boolean());
  EXPECT_TRUE(s["bf16"]["enabled"].get<bool>());
  EXPECT_FALSE(s["fp16"]["enabled"].get<bool>());
  EXPECT_FALSE(c.notes.empty());  // wrap=size has no DeepSpeed setting: said on stderr
  // Offload with DeepSpeed's own optimizer: a client torch optimizer with
  // offload is a ZeRORuntimeException in DeepSpeed.
  EXPECT_EQ(s["optimizer"]["type"], "AdamW");
  EXPECT_EQ(s["optimizer"]["params"]["weight_decay"], 0.01);
  EXPECT_EQ(all_notes(c).find("differs from the plan"), std::string::npos);  // stage 3: the plan's meaning
  EXPECT_FALSE(ojson::parse(export_one("zero3/bf16/wrap=none", LaunchFormat::kDeepSpeed).text).contains("optimizer"));

  const ojson z1 =
      ojson::parse(export_one("zero1+offload/fp16/wrap=none", LaunchFormat::kDeepSpeed).text);
  EXPECT_EQ(z1["zero_optimization"]["stage"], 1);
  EXPECT_FALSE(z1["zero_optimization"].contains("offload_param"));  // stage 3 only
  EXPECT_EQ(z1["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_TRUE(z1["fp16"]["enabled"].get<bool>());
  // Stage 1/2 keep the parameters on the GPU: the note says by how much.
  const std::string z1_notes = all_notes(export_one("zero1+offload/fp16/wrap=none", LaunchFormat::kDeepSpeed));
  EXPECT_NE(z1_notes.find("differs from the plan"), std::string::npos) << z1_notes;
  EXPECT_NE(z1_notes.find("(1.44 GiB)"), std::string::npos) << z1_notes;  // 774,030,080 fp16 parameters
  // hybrid: ZeRO++ hpZ, a secondary shard within each node's GPUs.
  const ojson hy = ojson::parse(export_one("hybrid/bf16/wrap=block", LaunchFormat::kDeepSpeed, 8, 2).text);
  EXPECT_EQ(hy["zero_optimization"]["stage"], 3);
  EXPECT_EQ(hy["zero_optimization"]["zero_hpz_partition_size"], 2);
  EXPECT_EQ(ojson::parse(export_one("ddp/fp32/wrap=none", LaunchFormat::kDeepSpeed)
                             .text)["zero_optimization"]["stage"],
            0);
  EXPECT_EQ(ojson::parse(export_one("zero2/fp32/wrap=block", LaunchFormat::kDeepSpeed)
                             .text)["zero_optimization"]["stage"],
            2);
  EXPECT_TRUE(ojson::parse(export_one("ddp+ckpt/fp32/wrap=block", LaunchFormat::kDeepSpeed).text)
                  .contains("activation_checkpointing"));
}

TEST(LaunchConfig, RefusesWhatTheTargetCannotExpress) {
  const std::string ddp = refusal("ddp+offload/fp32/wrap=none", LaunchFormat::kPython);
  EXPECT_NE(ddp.find("python cannot express 'ddp+offload/fp32/wrap=none'"), std::string::npos);
  EXPECT_EQ(ddp.find('\n'), std::string::npos);
  EXPECT_NE(refusal("zero1+offload/fp32/wrap=none", LaunchFormat::kFsdp).find("no offload"), std::string::npos);
  EXPECT_NE(refusal("ddp+offload/fp32/wrap=none", LaunchFormat::kAccelerate).find("accelerate cannot"),
            std::string::npos);
  // Two nodes for Accelerate: the address of machine_rank 0 is the user's.
  Plan two = plan_with("zero3/fp32/wrap=none", 4, 2, 2);
  try {
    export_launch_config(two, two.candidates[0], LaunchFormat::kAccelerate, "");
    ADD_FAILURE() << "no --main-process-ip was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--main-process-ip"), std::string::npos) << e.what();
  }
  EXPECT_NE(refusal("zero3+ckpt/fp32/wrap=none", LaunchFormat::kFsdp).find("wrap=none"),
            std::string::npos);
  // Nothing fits: nothing to launch.
  Plan plan = plan_with("zero3/fp32/wrap=none", 0);
  EXPECT_THROW(export_launch_config(plan, plan.candidates[0], LaunchFormat::kDeepSpeed, ""),
               InexpressibleCandidate);
  // wrap=block without a block class (a model shardfit cannot read).
  plan = plan_with("zero3/fp32/wrap=block", 4);
  EXPECT_THROW(export_launch_config(plan, plan.candidates[0], LaunchFormat::kFsdp, ""),
               std::invalid_argument);
}

// --format python: PyTorch's own objects, built from the candidate as the
// plan simulated it (running them: tests/pytorch/export_config_test.py).
TEST(LaunchConfig, PythonModuleBuildsPyTorchsObjects) {
  const std::string fsdp1 = export_one("hybrid+ckpt/bf16/wrap=block", LaunchFormat::kPython, 8, 2).text;
  for (const char* want : {"sharding_strategy=ShardingStrategy.HYBRID_SHARD",
                           "transformer_layer_cls=block_classes(model)", "cpu_offload=CPUOffload(offload_params=False)",
                           "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, "
                           "buffer_dtype=torch.bfloat16)",
                           "backward_prefetch=BackwardPrefetch.BACKWARD_PRE", "device_id=device",
                           "sync_module_states=device.type != \"cpu\"", "use_orig_params=False", "mesh_dim_names=(\"replicate\", \"shard\")",
                           "CheckpointImpl.NO_REENTRANT", "BLOCK_CLASS = \"GPT2Block\"", "BATCH_SIZE_PER_GPU = 8",
                           "WORLD_SIZE = 4", "foreach=False"})
    EXPECT_NE(fsdp1.find(want), std::string::npos) << want << "\n" << fsdp1;
  Plan plan = plan_with("zero2+offload/fp32/wrap=size:2000", 12, 2, 1);
  plan.stack = "pytorch";
  plan.pytorch_job = Plan::PytorchJob{"2.11", "none", "reentrant", 25 << 20, "pre", 2, 2, "bf16"};
  const std::string fsdp2 = export_launch_config(plan, plan.candidates[0], LaunchFormat::kPython, "").text;
  for (const char* want : {"reshard_after_forward=False", "mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)",
                           "offload_policy=CPUOffloadPolicy()", "MIN_NUM_PARAMS = 2000", "init_device_mesh(device_type, (world,))"})
    EXPECT_NE(fsdp2.find(want), std::string::npos) << want << "\n" << fsdp2;
  const std::string zero1 = export_one("zero1/fp32/wrap=none", LaunchFormat::kPython).text;
  EXPECT_NE(zero1.find("ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW"),
            std::string::npos)
      << zero1;
  EXPECT_NE(zero1.find("DistributedDataParallel(model, device_ids="), std::string::npos);
}

TEST(LaunchConfig, YamlQuotesWhatWouldChangeType) {
  ojson v{{"a", "no"}, {"b", "FSDP"}, {"c", 3},
          {"d", true}, {"e", "1"},    {"f", ojson{{"g", "x y"}}}};
  EXPECT_EQ(to_yaml(v), "a: 'no'\nb: FSDP\nc: 3\nd: true\ne: '1'\nf:\n  g: 'x y'\n");
}

}  // namespace
}  // namespace shardfit::planner
