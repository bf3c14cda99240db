// Device profiles: every shipped profile loads, says where each number came
// from, and the loader's and size parser's errors are one line naming the
// input.
#include "planner/profile.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/support/error_of.h"
#include "tests/support/scratch_dir.h"

namespace shardfit::planner {
namespace {

const std::string kProfilesDir = std::string(SHARDFIT_SOURCE_DIR) + "/profiles";

using test_support::error_of;

// The error parse_profile gives for `p` after `edit`.
std::string refusal(nlohmann::json p, const std::function<void(nlohmann::json&)>& edit) {
  edit(p);
  return error_of([&] { parse_profile(p.dump(), "cal.json"); });
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = shardfit::test_support::scratch_root().string() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ProfileTest, ShipsEveryProfileSpecAsksFor) {
  std::vector<std::string> names = list_profiles(kProfilesDir);
  for (const char* name : {"titan-rtx-24gb", "rtx3090-24gb", "v100-32gb", "a100-40gb", "a100-80gb",
                           "h100-80gb", "h200-141gb", "cpu"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

TEST(ProfileTest, EveryShippedProfileLoadsAndSourcesEveryNumber) {
  for (const std::string& name : list_profiles(kProfilesDir)) {
    SCOPED_TRACE(name);
    DeviceProfile p = load_profile(name, kProfilesDir);  // refuses unsourced numbers
    EXPECT_EQ(p.name, name);
    EXPECT_FALSE(p.description.empty());
    EXPECT_TRUE(p.supports(DType::kF32));
    EXPECT_GT(p.sources.size(), 15u);
    for (const auto& [field, source] : p.sources) EXPECT_GT(source.size(), 10u) << field;
    if (p.kind == DeviceKind::kCuda) {
      EXPECT_EQ(p.allocator, AllocatorKind::kCudaCaching);
      EXPECT_GT(p.memory_bytes, int64_t{20} << 30);
      EXPECT_GT(p.cuda_context_bytes, 0);
      EXPECT_TRUE(p.supports(DType::kF16));
      // Tensor cores: mixed precision peaks above FP32 (only ~2x on GeForce
      // Ampere, whose FP32 rate doubled and FP32-accumulate rate halved).
      EXPECT_GT(p.fp16_flops_per_s, 1.9 * p.fp32_flops_per_s);
    }
  }
}

TEST(ProfileTest, KnowsWhichCardsLackBf16) {
  EXPECT_FALSE(load_profile("titan-rtx-24gb", kProfilesDir).supports(DType::kBF16));
  EXPECT_FALSE(load_profile("v100-32gb", kProfilesDir).supports(DType::kBF16));
  for (const char* name : {"rtx3090-24gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"})
    EXPECT_TRUE(load_profile(name, kProfilesDir).supports(DType::kBF16)) << name;
}

TEST(ProfileTest, TitanRtxMatchesTheReferenceCapacity) {
  DeviceProfile p = load_profile("titan-rtx-24gb", kProfilesDir);
  EXPECT_EQ(format_gib(p.memory_bytes), "23.65 GiB");  // as PyTorch reported it
  EXPECT_NE(p.sources.at("memory_bytes").find("23.65"), std::string::npos);
  EXPECT_DOUBLE_EQ(p.fp32_flops_per_s, 16.3e12);
}

TEST(ProfileTest, CpuProfileIsExactUnlimitedAndHonest) {
  DeviceProfile p = load_profile("cpu", kProfilesDir);
  EXPECT_EQ(p.kind, DeviceKind::kCpu);
  EXPECT_EQ(p.allocator, AllocatorKind::kExact);
  EXPECT_EQ(p.memory_bytes, 0);
  EXPECT_NE(p.sources.at("peak_flops_per_s.fp32").find("not measured"), std::string::npos);
  EXPECT_EQ(p.allocator_budget_bytes(0, 4), 0);  // unlimited stays unlimited
}

TEST(ProfileTest, AllocatorBudgetSubtractsWhatLivesOutsideTheAllocator) {
  DeviceProfile p = load_profile("titan-rtx-24gb", kProfilesDir);
  int64_t mem = int64_t{24} << 30;
  EXPECT_EQ(p.allocator_budget_bytes(mem, 1), mem - p.cuda_context_bytes);
  EXPECT_EQ(p.allocator_budget_bytes(mem, 2), mem - p.cuda_context_bytes - p.nccl_buffers_bytes);
  std::string err = error_of([&] { p.allocator_budget_bytes(int64_t{100} << 20, 2); });
  EXPECT_NE(err.find("titan-rtx-24gb"), std::string::npos) << err;
  EXPECT_NE(err.find("--gpu-mem"), std::string::npos) << err;
}

TEST(ProfileTest, UnknownNameListsTheKnownProfilesOnOneLine) {
  std::string err = error_of([] { load_profile("titan-rtx", kProfilesDir); });
  EXPECT_NE(err.find("'titan-rtx'"), std::string::npos) << err;
  EXPECT_NE(err.find("titan-rtx-24gb"), std::string::npos) << err;
  EXPECT_NE(err.find("h200-141gb"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

TEST(ProfileTest, LoadsByPath) {
  std::string path = write_temp("copy.json", read_text(kProfilesDir + "/a100-40gb.json"));
  EXPECT_EQ(load_profile(path, "/nonexistent").name, "a100-40gb");
  std::string err = error_of([] { load_profile("/nonexistent/x.json", kProfilesDir); });
  EXPECT_NE(err.find("/nonexistent/x.json"), std::string::npos) << err;
}

// The H200's cuBLAS workspaces as measured on the card (reports/gpu/): three
// blocks the caching allocator sees, charged one by one, summed for the rest.
TEST(ProfileTest, CublasWorkspacesAreTheBlocksMeasuredOnTheH200) {
  const DeviceProfile h200 = load_profile("h200-141gb", kProfilesDir);
  EXPECT_EQ(h200.cublas_workspace_allocations, (std::vector<int64_t>{32 << 20, 1 << 20, 32 << 20}));
  EXPECT_EQ(h200.cublas_workspace_bytes, int64_t{65} << 20);
  EXPECT_NE(h200.sources.at("overheads_bytes.cublas_workspace").find("measured 2026-11-30"), std::string::npos);
  const DeviceProfile titan = load_profile("titan-rtx-24gb", kProfilesDir);  // one number: one block
  EXPECT_EQ(titan.cublas_workspace_allocations, std::vector<int64_t>{titan.cublas_workspace_bytes});
  // A list is a number like any other: refused without a source, or with a negative entry.
  std::string text = read_text(kProfilesDir + "/h200-141gb.json");
  const std::string key = "\"overheads_bytes.cublas_workspace\":";
  std::string unsourced = text;
  unsourced.replace(unsourced.find(key), key.size(), "\"overheads_bytes.unrelated\":");
  std::string err = error_of([&] { load_profile(write_temp("unsourced.json", unsourced), kProfilesDir); });
  EXPECT_NE(err.find("overheads_bytes.cublas_workspace"), std::string::npos) << err;
  std::string negative = text;
  negative.replace(negative.find("[33554432, 1048576"), 18, "[33554432, -1");
  err = error_of([&] { load_profile(write_temp("negative.json", negative), kProfilesDir); });
  EXPECT_NE(err.find("list of them"), std::string::npos) << err;
}

TEST(ProfileTest, MalformedJsonNamesTheFile) {
  std::string path = write_temp("broken.json", "{\"name\": \"x\",");
  std::string err = error_of([&] { load_profile(path, kProfilesDir); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("malformed JSON"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

TEST(ProfileTest, MissingOrBadFieldsNameFileAndField) {
  nlohmann::json good = nlohmann::json::parse(read_text(kProfilesDir + "/v100-32gb.json"));

  nlohmann::json missing = good;
  missing["gpu_link"].erase("bytes_per_s");
  std::string path = write_temp("missing.json", missing.dump());
  std::string err = error_of([&] { load_profile(path, kProfilesDir); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("'gpu_link.bytes_per_s' is missing"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  nlohmann::json wrong_type = good;
  wrong_type["memory_bytes"] = "32 GB";
  err = error_of([&] { parse_profile(wrong_type.dump(), "v.json"); });
  EXPECT_NE(err.find("'memory_bytes'"), std::string::npos) << err;

  nlohmann::json bad_fraction = good;
  bad_fraction["efficiency"]["collective"] = 1.5;
  err = error_of([&] { parse_profile(bad_fraction.dump(), "v.json"); });
  EXPECT_NE(err.find("'efficiency.collective'"), std::string::npos) << err;

  nlohmann::json bad_kind = good;
  bad_kind["kind"] = "tpu";
  err = error_of([&] { parse_profile(bad_kind.dump(), "v.json"); });
  EXPECT_NE(err.find("'kind'"), std::string::npos) << err;
}

TEST(ProfileTest, RefusesANumberWithoutASource) {
  nlohmann::json p = nlohmann::json::parse(read_text(kProfilesDir + "/a100-80gb.json"));
  p["sources"].erase("memory_bytes_per_s");
  std::string err = error_of([&] { parse_profile(p.dump(), "a.json"); });
  EXPECT_NE(err.find("'memory_bytes_per_s' has no entry in 'sources'"), std::string::npos) << err;

  // An extra number anywhere needs a source too.
  p = nlohmann::json::parse(read_text(kProfilesDir + "/a100-80gb.json"));
  p["gpu_link"]["latency_s"] = 5e-6;
  err = error_of([&] { parse_profile(p.dump(), "a.json"); });
  EXPECT_NE(err.find("'gpu_link.latency_s'"), std::string::npos) << err;
}

TEST(ProfileTest, ReadsMeasuredKernelsAndRefusesAMalformedGrid) {
  nlohmann::json p = nlohmann::json::parse(read_text(kProfilesDir + "/cpu.json"));
  p["gpu_link"]["latency_s"] = 1e-4;
  p["measured_kernels"] = {{"op_overhead_s", 2e-6},
                           {"matmul_dims", {16, 64}},
                           {"matmul_flops_per_s", {{"fp32", std::vector<double>(8, 5e10)}}},
                           {"kernel_bytes_per_s", {{"fp32", {{"aten::gelu", 3e9}}}}}};
  for (const char* f : {"gpu_link.latency_s", "measured_kernels.op_overhead_s", "measured_kernels.matmul_dims",
                        "measured_kernels.matmul_flops_per_s.fp32", "measured_kernels.kernel_bytes_per_s.fp32.aten::gelu"})
    p["sources"][f] = "measured by this test, made up";
  const DeviceProfile d = parse_profile(p.dump(), "cal.json");
  EXPECT_DOUBLE_EQ(d.gpu_link.latency_s, 1e-4);
  EXPECT_DOUBLE_EQ(d.measured_kernels.op_overhead_s, 2e-6);
  EXPECT_TRUE(d.measured_kernels.times(DType::kF32));
  EXPECT_FALSE(d.measured_kernels.times(DType::kBF16));
  EXPECT_NEAR(d.measured_kernels.matmul_rate(DType::kF32, {1, 32, 32, 32}), 5e10, 1e-2);
  EXPECT_DOUBLE_EQ(d.measured_kernels.kernel_bytes_per_s.at(DType::kF32).at("aten::gelu"), 3e9);
  // Shipped datasheet profiles measured nothing: FLOPs over one rate.
  EXPECT_FALSE(load_profile("a100-80gb", kProfilesDir).measured_kernels.times(DType::kF32));

  std::string err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["matmul_flops_per_s"]["fp32"] = {1e9, 2e9};
  });
  EXPECT_NE(err.find("'measured_kernels.matmul_flops_per_s.fp32' must be a list of 8 rates"), std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["matmul_dims"] = {64, 16};
  });
  EXPECT_NE(err.find("'measured_kernels.matmul_dims' must be a list of ascending"), std::string::npos) << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["sources"].erase("measured_kernels.kernel_bytes_per_s.fp32.aten::gelu");
  });
  EXPECT_NE(err.find("has no entry in 'sources'"), std::string::npos) << err;
}

// cpu.json with measured kernels (made up: one rate for every product) and
// `lines`, a table of calibrate --stack pytorch's lines, as
// measured_kernels.`table`; every figure sourced.
nlohmann::json calibrated_cpu(const std::string& table, const nlohmann::json& lines) {
  nlohmann::json p = nlohmann::json::parse(read_text(kProfilesDir + "/cpu.json"));
  p["measured_kernels"] = {{"op_overhead_s", 2e-6}, {"matmul_dims", {16}}, {"matmul_flops_per_s", {{"fp32", {5e10}}}}};
  p["measured_kernels"][table] = lines;
  for (const char* f : {"measured_kernels.op_overhead_s", "measured_kernels.matmul_dims",
                        "measured_kernels.matmul_flops_per_s.fp32"})
    p["sources"][f] = "measured by this test, made up";
  for (const auto& [outer, inners] : lines.items())
    for (const auto& [inner, line] : inners.items())
      for (const auto& [figure, value] : line.items())
        p["sources"]["measured_kernels." + table + "." + outer + "." + inner + "." + figure] = "made up";
  return p;
}

// `calibrate --stack pytorch`'s AdamW lines: read by step and tensor kind;
// a step or kind the time model does not know is refused by name.
TEST(ProfileTest, ReadsAdamwStepDispatchLines) {
  const nlohmann::json p = calibrated_cpu(
      "adamw_steps", {{"for-loop",
                       {{"tensor", {{"fixed_s", 3e-5}, {"per_tensor_s", 2e-5}, {"per_shape_s", 0}}},
                        {"dtensor", {{"fixed_s", 1e-4}, {"per_tensor_s", 1e-4}, {"per_shape_s", 1.4e-3}}}}}});
  const MeasuredKernels k = parse_profile(p.dump(), "cal.json").measured_kernels;
  ASSERT_NE(k.adamw_step("for-loop", "dtensor"), nullptr);
  EXPECT_DOUBLE_EQ(k.adamw_step("for-loop", "dtensor")->per_shape_s, 1.4e-3);
  EXPECT_DOUBLE_EQ(k.adamw_step("for-loop", "tensor")->per_tensor_s, 2e-5);
  EXPECT_EQ(k.adamw_step("foreach", "tensor"), nullptr);  // not measured
  std::string err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["adamw_steps"]["sgd"] = j["measured_kernels"]["adamw_steps"]["for-loop"];
  });
  EXPECT_NE(err.find("'measured_kernels.adamw_steps.sgd' names no AdamW step"), std::string::npos) << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["adamw_steps"]["for-loop"]["jagged"] = {
        {"fixed_s", 1}, {"per_tensor_s", 1}, {"per_shape_s", 1}};
  });
  EXPECT_NE(err.find("'measured_kernels.adamw_steps.for-loop.jagged' names no tensor kind"), std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["adamw_steps"]["for-loop"]["tensor"]["per_tensor_s"] = -1;
  });
  EXPECT_NE(err.find("'measured_kernels.adamw_steps.for-loop.tensor.per_tensor_s' must be a finite number >= 0"),
            std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["adamw_steps"]["for-loop"]["tensor"].erase("per_shape_s");
  });
  EXPECT_NE(err.find("'measured_kernels.adamw_steps.for-loop.tensor.per_shape_s' is missing"), std::string::npos)
      << err;
}

TEST(ProfileTest, FileNameAndNameMustAgree) {
  std::string dir = shardfit::test_support::scratch_root().string() + "/mismatch_profiles";
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/other.json") << read_text(kProfilesDir + "/cpu.json");
  std::string err = error_of([&] { load_profile("other", dir); });
  EXPECT_NE(err.find("'name'"), std::string::npos) << err;
}

TEST(ProfileTest, ParsesSizes) {
  EXPECT_EQ(parse_size_bytes("24GiB"), int64_t{24} << 30);
  EXPECT_EQ(parse_size_bytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_size_bytes("1.5GB"), 1500000000);
  EXPECT_EQ(parse_size_bytes("123456"), 123456);
  EXPECT_EQ(parse_size_bytes("123456B"), 123456);
  EXPECT_EQ(parse_size_bytes("8 kib"), 8192);
  EXPECT_EQ(parse_size_bytes("0.5KiB"), 512);
  EXPECT_EQ(parse_size_bytes("2TB"), 2000000000000);
  EXPECT_EQ(parse_size_bytes("23.65GiB"), 25393994138);  // round(23.65 * 2^30)
  EXPECT_EQ(parse_size_bytes("0"), 0);
}

TEST(ProfileTest, SizeErrorsAreOneLineAndNameTheText) {
  for (const char* text :
       {"", "GiB", "24G", "-1GiB", "1.5", "12 GiB extra", "1.2.3MiB", "99999999999TiB", "abc"}) {
    std::string err = error_of([&] { parse_size_bytes(text); });
    EXPECT_NE(err.find(std::string("'") + text + "'"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  EXPECT_NE(error_of([] { parse_size_bytes("24G"); }).find("GiB"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_bytes("-5"); }).find("negative"), std::string::npos);
}

class ProfilesDirTest : public testing::Test {
 protected:
  void SetUp() override {
    const char* env = getenv("SHARDFIT_PROFILES");
    if (env) saved_ = env;
    had_env_ = env != nullptr;
    unsetenv("SHARDFIT_PROFILES");
  }
  void TearDown() override {
    if (had_env_) {
      setenv("SHARDFIT_PROFILES", saved_.c_str(), 1);
    } else {
      unsetenv("SHARDFIT_PROFILES");
    }
  }
  bool had_env_ = false;
  std::string saved_;
};

TEST_F(ProfilesDirTest, TakesTheFirstCandidateHoldingProfiles) {
  std::string empty_dir = shardfit::test_support::scratch_root().string() + "/empty_profiles";
  ASSERT_EQ(system(("mkdir -p '" + empty_dir + "'").c_str()), 0);
  EXPECT_EQ(find_profiles_dir({"/nonexistent", empty_dir, kProfilesDir}), kProfilesDir);
}

TEST_F(ProfilesDirTest, EnvironmentWins) {
  std::string dir = shardfit::test_support::scratch_root().string();
  setenv("SHARDFIT_PROFILES", dir.c_str(), 1);
  EXPECT_EQ(find_profiles_dir({kProfilesDir}), dir);
  setenv("SHARDFIT_PROFILES", "/nonexistent/profiles", 1);
  std::string err = error_of([] { find_profiles_dir({kProfilesDir}); });
  EXPECT_NE(err.find("/nonexistent/profiles"), std::string::npos) << err;
}

TEST_F(ProfilesDirTest, NothingFoundSaysWhereItLooked) {
  std::string err = error_of([] { find_profiles_dir({"/nonexistent/a", "/nonexistent/b"}); });
  EXPECT_NE(err.find("/nonexistent/a"), std::string::npos) << err;
  EXPECT_NE(err.find("SHARDFIT_PROFILES"), std::string::npos) << err;
}

TEST(ProfileTest, DefaultDirsSitNextToTheExecutable) {
  std::vector<std::string> dirs = default_profile_dirs("/opt/shardfit/bin/shardfit");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs[0], "/opt/shardfit/bin/../profiles");
}

// `calibrate --stack pytorch`'s FSDP hook lines, FSDP1's and FSDP2's: read
// by version, sharding and phase; a sharding or phase the time model does
// not charge is refused by name, and a line's missing field is named.
TEST(ProfileTest, ReadsFsdpHookLines) {
  const nlohmann::json lines = {
      {"zero3",
       {{"forward", {{"fixed_s", 1e-4}, {"per_group_s", 1.5e-3}, {"per_param_s", 1e-4}}},
        {"backward", {{"fixed_s", 0}, {"per_group_s", 3e-3}, {"per_param_s", 2e-4}}}}}};
  nlohmann::json p = calibrated_cpu("fsdp2_hooks", lines);
  p["measured_kernels"]["fsdp1_hooks"] = {{"zero2", lines["zero3"]}};
  for (const char* phase : {"forward", "backward"})
    for (const char* figure : {"fixed_s", "per_group_s", "per_param_s"})
      p["sources"][std::string("measured_kernels.fsdp1_hooks.zero2.") + phase + "." + figure] = "made up";
  const MeasuredKernels k = parse_profile(p.dump(), "cal.json").measured_kernels;
  ASSERT_NE(k.fsdp_hook(2, "zero3", "backward"), nullptr);
  EXPECT_DOUBLE_EQ(k.fsdp_hook(2, "zero3", "backward")->per_group_s, 3e-3);
  EXPECT_DOUBLE_EQ(k.fsdp_hook(2, "zero3", "forward")->per_param_s, 1e-4);
  ASSERT_NE(k.fsdp_hook(1, "zero2", "forward"), nullptr);
  EXPECT_DOUBLE_EQ(k.fsdp_hook(1, "zero2", "forward")->per_group_s, 1.5e-3);
  EXPECT_EQ(k.fsdp_hook(2, "zero2", "forward"), nullptr);  // not measured
  EXPECT_EQ(k.fsdp_hook(1, "zero3", "forward"), nullptr);
  std::string err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["fsdp2_hooks"]["ddp"] = lines["zero3"];
  });
  EXPECT_NE(err.find("'measured_kernels.fsdp2_hooks.ddp' names no FSDP sharding (zero3, zero2)"), std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["fsdp1_hooks"]["zero2"]["optimizer"] = lines["zero3"]["forward"];
  });
  EXPECT_NE(err.find("'measured_kernels.fsdp1_hooks.zero2.optimizer' names no phase (forward, backward)"),
            std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["fsdp2_hooks"]["zero3"]["forward"].erase("per_group_s");
  });
  EXPECT_NE(err.find("'measured_kernels.fsdp2_hooks.zero3.forward.per_group_s' is missing"), std::string::npos)
      << err;
}

// `calibrate --stack pytorch`'s broadcast from Python: optional, and a
// number >= 0 like every other figure.
TEST(ProfileTest, ReadsTheMeasuredBroadcast) {
  nlohmann::json p = calibrated_cpu("adamw_steps", nlohmann::json::object());
  EXPECT_EQ(parse_profile(p.dump(), "cal.json").measured_kernels.broadcast_s, 0);  // not measured
  p["measured_kernels"]["broadcast_s"] = 4.9e-4;
  p["sources"]["measured_kernels.broadcast_s"] = "made up";
  EXPECT_DOUBLE_EQ(parse_profile(p.dump(), "cal.json").measured_kernels.broadcast_s, 4.9e-4);
  p["measured_kernels"]["broadcast_s"] = -1;
  const std::string err = error_of([&] { parse_profile(p.dump(), "cal.json"); });
  EXPECT_NE(err.find("'measured_kernels.broadcast_s' must be a finite number >= 0"), std::string::npos) << err;
}

// `calibrate --stack pytorch`'s DDP lines: read by gradient mode and phase,
// a bucket's figure under per_bucket_s; a mode DDP does not have is refused
// by name. The buffers' broadcast is optional.
TEST(ProfileTest, ReadsDdpHookLines) {
  const nlohmann::json line = {{"fixed_s", 1e-4}, {"per_bucket_s", 6e-4}, {"per_param_s", 8e-6}};
  nlohmann::json p = calibrated_cpu("ddp_hooks", {{"copy", {{"forward", line}, {"backward", line}}}});
  MeasuredKernels k = parse_profile(p.dump(), "cal.json").measured_kernels;
  ASSERT_NE(k.ddp_hook("copy", "backward"), nullptr);
  EXPECT_DOUBLE_EQ(k.ddp_hook("copy", "backward")->per_group_s, 6e-4);
  EXPECT_DOUBLE_EQ(k.ddp_hook("copy", "forward")->per_param_s, 8e-6);
  EXPECT_EQ(k.ddp_hook("view", "backward"), nullptr);  // not measured
  EXPECT_EQ(k.ddp_buffers_s, 0);
  p["measured_kernels"]["ddp_buffers_s"] = 2.4e-4;
  p["sources"]["measured_kernels.ddp_buffers_s"] = "made up";
  EXPECT_DOUBLE_EQ(parse_profile(p.dump(), "cal.json").measured_kernels.ddp_buffers_s, 2.4e-4);
  std::string err = refusal(p, [&](nlohmann::json& j) { j["measured_kernels"]["ddp_hooks"]["fp16"] = {}; });
  EXPECT_NE(err.find("'measured_kernels.ddp_hooks.fp16' names no DDP gradient mode (copy, view)"), std::string::npos)
      << err;
  err = refusal(p, [&](nlohmann::json& j) {
    j["measured_kernels"]["ddp_hooks"]["copy"]["forward"].erase("per_bucket_s");
  });
  EXPECT_NE(err.find("'measured_kernels.ddp_hooks.copy.forward.per_bucket_s' is missing"), std::string::npos) << err;
}

}  // namespace
}  // namespace shardfit::planner
