// Sharded checkpoints (executor/checkpoint.h): bit-exact round trips, one-line
// errors for damaged or mismatched checkpoints, crash safety of the writes,
// and the consolidated safetensors export checked tensor by tensor against
// the parameters the shards were cut from. Everything is tiny: runs in
// well under a second.
#include "executor/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "models/model_config.h"
#include "models/module_table.h"
#include "spec/wrap_policy.h"

namespace shardfit::executor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("shardfit_ckpt_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string tensor_bytes(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// Same dtype, shape and bytes: NaN payloads and -0.0 included.
::testing::AssertionResult bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type()) return ::testing::AssertionFailure() << "dtypes differ";
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << a.sizes() << " vs " << b.sizes();
  if (tensor_bytes(a) != tensor_bytes(b)) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// Runs f, expects std::invalid_argument whose message is one line naming
// `file` and containing `problem`.
template <typename F>
void expect_error(F&& f, const fs::path& file, const std::string& problem) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << file << " and saying '" << problem << "'";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// A unit of two parameters (11 elements: padded to 12 over 2 ranks).
spec::FlatParamLayout small_layout(int world) {
  return spec::FlatParamLayout({{"a.weight", {2, 3}, 6}, {"a.bias", {5}, 5}}, world);
}

// A state with every dtype the format supports and values that only a
// bit-exact path preserves.
RankState varied_state(int shard_index, int64_t step) {
  torch::manual_seed(17 + shard_index);
  RankState s;
  const spec::FlatParamLayout layout = small_layout(2);
  torch::Tensor shard = torch::randn({layout.shard_numel()});
  const uint32_t nan_payload = 0x7fc00123u;
  std::memcpy(shard.data_ptr<float>(), &nan_payload, 4);
  shard[1] = -0.0f;
  shard[2] = std::numeric_limits<float>::denorm_min();
  shard[3] = std::numeric_limits<float>::infinity();
  s.tensors["unit0.param_shard"] = shard;
  s.tensors["unit0.exp_avg"] = torch::randn({layout.shard_numel()});
  s.tensors["unit0.exp_avg_sq"] = torch::rand({layout.shard_numel()});
  s.tensors["bf16"] = torch::randn({3, 5}).to(torch::kBFloat16);
  s.tensors["fp16"] = torch::randn({7}).to(torch::kHalf);
  s.tensors["f64"] = torch::randn({2, 2}, torch::kFloat64);
  s.tensors["i64"] = torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                                    std::numeric_limits<int64_t>::max()});
  s.tensors["flags"] = torch::tensor({true, false, true});
  s.tensors["empty"] = torch::empty({0, 4});
  s.tensors["transposed"] = torch::randn({4, 6}).t();  // saved from a non-contiguous view
  s.metadata = {
      {"step", step},
      {"loss_scale", 65536.0},
      {"lr", 1.0 / 3.0},
      {"rng", {{"seed", std::numeric_limits<uint64_t>::max()}, {"offset", int64_t{123456789012}}}},
      {"data", {{"epoch", 1}, {"position", 777}}}};
  s.units.push_back(
      UnitShardLayout::from("transformer.h.0", "unit0.param_shard", layout, shard_index));
  return s;
}

void save_committed(const fs::path& dir, const std::vector<RankState>& ranks) {
  const int world = static_cast<int>(ranks.size());
  for (int r = 0; r < world; ++r) save_rank_checkpoint(dir, r, world, ranks[r]);
  write_checkpoint_manifest(dir, world);
}

void expect_same_state(const RankState& got, const RankState& want) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [name, t] : want.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << name;
    EXPECT_TRUE(bit_equal(got.tensors.at(name), t)) << name;
  }
  EXPECT_EQ(got.metadata, want.metadata);
  EXPECT_EQ(got.units, want.units);
}

TEST(CheckpointTest, RankStateRoundTripIsBitExact) {
  TempDir dir;
  const std::vector<RankState> ranks = {varied_state(0, 100), varied_state(1, 100)};
  save_committed(dir.path(), ranks);
  for (int r = 0; r < 2; ++r) {
    const RankState got = load_rank_checkpoint(dir.path(), r, 2);
    expect_same_state(got, ranks[r]);
    for (const auto& [name, t] : got.tensors)
      EXPECT_TRUE(t.is_contiguous() && t.device().is_cpu()) << name;
  }
  EXPECT_EQ(load_rank_checkpoint(dir.path(), 0, 2).metadata["rng"]["seed"].get<uint64_t>(),
            std::numeric_limits<uint64_t>::max());

  // The byte layout the header comment promises.
  const std::string file = read_bytes(dir.path() / "rank-1-of-2.shardfit");
  ASSERT_GE(file.size(), 16u);
  EXPECT_EQ(file.substr(0, 8), "SHRDFIT1");
  uint64_t n = 0;
  std::memcpy(&n, file.data() + 8, 8);
  EXPECT_EQ(n % 8, 0u);
  const json header = json::parse(file.substr(16, n));
  EXPECT_EQ(header["format"], "shardfit.rank/1");
  EXPECT_EQ(file.size(), 16 + n + header["data_bytes"].get<uint64_t>());
  const json manifest = json::parse(read_bytes(dir.path() / "manifest.json"));
  EXPECT_EQ(manifest["world_size"], 2);
  EXPECT_EQ(manifest["ranks"][1]["bytes"].get<uint64_t>(), file.size());
}

TEST(CheckpointTest, LoadIntoFillsTheJobsTensorsInPlace) {
  TempDir dir;
  const RankState saved = varied_state(0, 5);
  save_committed(dir.path(), {saved, varied_state(1, 5)});
  std::map<std::string, torch::Tensor> job;
  for (const auto& [name, t] : saved.tensors) job[name] = torch::zeros(t.sizes(), t.options());
  const void* before = job["unit0.param_shard"].data_ptr();
  const RankState got = load_rank_checkpoint_into(dir.path(), 0, 2, job);
  EXPECT_EQ(job["unit0.param_shard"].data_ptr(), before);
  expect_same_state(got, saved);
  for (const auto& [name, t] : saved.tensors) EXPECT_TRUE(bit_equal(job[name], t)) << name;

  const fs::path file = dir.path() / "rank-0-of-2.shardfit";
  auto wrong = job;
  wrong["unit0.exp_avg"] = torch::zeros({7});
  expect_error([&] { load_rank_checkpoint_into(dir.path(), 0, 2, wrong); }, file,
               "tensor 'unit0.exp_avg' is F32 [6], this job has F32 [7]");
  wrong = job;
  wrong["unit0.exp_avg"] = torch::zeros({6}, torch::kBFloat16);
  expect_error([&] { load_rank_checkpoint_into(dir.path(), 0, 2, wrong); }, file,
               "this job has BF16 [6]");
  wrong = job;
  wrong["unit1.exp_avg"] = torch::zeros({6});
  expect_error([&] { load_rank_checkpoint_into(dir.path(), 0, 2, wrong); }, file,
               "has no tensor 'unit1.exp_avg'");
  wrong = job;
  wrong.erase("flags");
  expect_error([&] { load_rank_checkpoint_into(dir.path(), 0, 2, wrong); }, file,
               "holds tensor 'flags', which this job does not expect");
}

TEST(CheckpointTest, TruncatedRankFileIsAOneLineErrorNamingIt) {
  TempDir dir;
  save_committed(dir.path(), {varied_state(0, 1), varied_state(1, 1)});
  const fs::path file = dir.path() / "rank-0-of-2.shardfit";
  const std::string good = read_bytes(file);
  const std::vector<std::pair<size_t, std::string>> cuts = {
      {good.size() - 1, "(truncated)"},
      {good.size() / 2, "does not fit"},
      {10, "shorter than the 16-byte preamble"}};
  for (const auto& [size, problem] : cuts) {
    write_bytes(file, good.substr(0, size));
    expect_error([&] { load_rank_checkpoint(dir.path(), 0, 2); }, file, problem);
    expect_error([&] { export_safetensors(dir.path(), dir.path() / "out.safetensors"); }, file,
                 problem);
  }
  write_bytes(file, good + "xx");
  expect_error([&] { load_rank_checkpoint(dir.path(), 0, 2); }, file, "(trailing bytes)");
}

TEST(CheckpointTest, CorruptHeaderIsAOneLineErrorNamingIt) {
  TempDir dir;
  save_committed(dir.path(), {varied_state(0, 1), varied_state(1, 1)});
  const fs::path file = dir.path() / "rank-0-of-2.shardfit";
  const std::string good = read_bytes(file);
  auto corrupt = [&](auto edit, const std::string& problem) {
    std::string bytes = good;
    edit(bytes);
    write_bytes(file, bytes);
    expect_error([&] { load_rank_checkpoint(dir.path(), 0, 2); }, file, problem);
  };
  corrupt([](std::string& b) { b[0] = 'X'; }, "bad magic");
  corrupt([](std::string& b) { b[16] = '#'; }, "header is not valid JSON (parse error at byte 1)");
  corrupt([](std::string& b) { std::memset(&b[8], 0xff, 8); }, "header length");
  corrupt([](std::string& b) { b.replace(b.find("\"BF16\""), 6, "\"XF16\""); },
          "unsupported dtype 'XF16'");
  // Same byte count, so only the header hash in the manifest can tell.
  corrupt([](std::string& b) { b.replace(b.find("[3,5]"), 5, "[5,3]"); },
          "is not the file manifest.json committed");
  corrupt([](std::string& b) { b.replace(b.find("[3,5]"), 5, "[3,6]"); }, "needs 36");
  corrupt([](std::string& b) { b.replace(b.find("\"shard_numel\":6"), 15, "\"shard_numel\":7"); },
          "padded 12, 6 per rank");
}

// The header hash says nothing about the data; its checksums do.
TEST(CheckpointTest, CorruptTensorDataIsAnErrorNamingTheFileAndTheTensor) {
  TempDir dir;
  save_committed(dir.path(), {varied_state(0, 1), varied_state(1, 1)});
  const fs::path file = dir.path() / "rank-1-of-2.shardfit";
  std::string bytes = read_bytes(file);
  const float big = 1e30f;
  std::memcpy(&bytes[bytes.size() - sizeof big], &big, sizeof big);  // the last tensor's last element
  write_bytes(file, bytes);
  expect_error([&] { load_rank_checkpoint(dir.path(), 1, 2); }, file, "data checksum mismatch");
  expect_error([&] { export_safetensors(dir.path(), dir.path() / "out.safetensors"); }, file, "': data checksum");
  EXPECT_FALSE(fs::exists(dir.path() / "out.safetensors"));
  EXPECT_NO_THROW(load_rank_checkpoint(dir.path(), 0, 2));  // the other rank's file is sound
}

TEST(CheckpointTest, WorldSizeMismatchNamesBothSizes) {
  TempDir dir;
  std::vector<RankState> ranks;
  for (int r = 0; r < 4; ++r) {
    RankState s;
    s.tensors["x"] = torch::full({2}, static_cast<float>(r));
    ranks.push_back(s);
  }
  save_committed(dir.path(), ranks);
  expect_error([&] { load_rank_checkpoint(dir.path(), 0, 2); }, dir.path() / "manifest.json",
               "checkpoint was written by 4 ranks, this job has 2");
  EXPECT_TRUE(
      bit_equal(load_rank_checkpoint(dir.path(), 3, 4).tensors.at("x"), torch::full({2}, 3.0f)));
}

TEST(CheckpointTest, UncommittedOrRewrittenCheckpointDoesNotLoad) {
  TempDir dir;
  save_rank_checkpoint(dir.path(), 0, 2, varied_state(0, 1));
  expect_error([&] { load_rank_checkpoint(dir.path(), 0, 2); }, dir.path() / "manifest.json",
               "never committed");
  expect_error([&] { write_checkpoint_manifest(dir.path(), 2); },
               dir.path() / "rank-1-of-2.shardfit", "missing");
  save_rank_checkpoint(dir.path(), 1, 2, varied_state(1, 1));
  write_checkpoint_manifest(dir.path(), 2);
  // A later save into the same directory that got as far as rank 1 only.
  save_rank_checkpoint(dir.path(), 1, 2, varied_state(1, 2));
  expect_error([&] { load_rank_checkpoint(dir.path(), 1, 2); }, dir.path() / "rank-1-of-2.shardfit",
               "is not the file manifest.json committed");
}

TEST(CheckpointTest, SaveRejectsAnInconsistentLayout) {
  TempDir dir;
  const fs::path file = dir.path() / "rank-0-of-2.shardfit";
  RankState s = varied_state(0, 1);
  s.tensors.erase("unit0.param_shard");
  expect_error([&] { save_rank_checkpoint(dir.path(), 0, 2, s); }, file, "which is not saved");
  s = varied_state(0, 1);
  s.tensors["unit0.param_shard"] = torch::zeros({5});
  expect_error([&] { save_rank_checkpoint(dir.path(), 0, 2, s); }, file, "expected a floating [6]");
  s = varied_state(0, 1);
  s.units[0].params[1].offset = 7;
  expect_error([&] { save_rank_checkpoint(dir.path(), 0, 2, s); }, file, "packing puts it at 6");
  expect_error([&] { save_rank_checkpoint(dir.path(), 0, 1, varied_state(0, 1)); },
               dir.path() / "rank-0-of-1.shardfit", "cut over 2 ranks, the job has 1");
  EXPECT_FALSE(fs::exists(file));
}

TEST(CheckpointTest, FailedWriteNeverReplacesTheGoodFile) {
  TempDir dir;
  const RankState good = varied_state(0, 1);
  save_committed(dir.path(), {good, varied_state(1, 1)});
  const fs::path file = dir.path() / "rank-0-of-2.shardfit";
  const std::string good_bytes = read_bytes(file);
  // In the preamble, in the header, in the tensor data.
  for (int64_t fail_at : {int64_t{4}, int64_t{100}, static_cast<int64_t>(good_bytes.size()) - 8}) {
    inject_write_failure_for_testing(fail_at);
    try {
      save_rank_checkpoint(dir.path(), 0, 2, varied_state(0, 2));
      ADD_FAILURE() << "the injected failure at byte " << fail_at << " did not fire";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(read_bytes(file), good_bytes) << "fail at " << fail_at;
  }
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  expect_same_state(load_rank_checkpoint(dir.path(), 0, 2), good);

  const fs::path out = dir.path() / "model.safetensors";
  inject_write_failure_for_testing(64);
  EXPECT_THROW(export_safetensors(dir.path(), out), std::runtime_error);
  EXPECT_FALSE(fs::exists(out));
  inject_write_failure_for_testing(-1);
}

TEST(CheckpointTest, StrayTempFileFromACrashIsIgnored) {
  TempDir dir;
  const RankState good = varied_state(0, 1);
  save_committed(dir.path(), {good, varied_state(1, 1)});
  write_bytes(dir.path() / "rank-0-of-2.shardfit.tmp.99999", "SHRDFIT1 half a file");
  expect_same_state(load_rank_checkpoint(dir.path(), 0, 2), good);
  EXPECT_NO_THROW(export_safetensors(dir.path(), dir.path() / "out.safetensors"));
}

// --------------------------------------------------------- consolidation

// Cuts `originals` into the shards of `layouts` as an FSDP rank holds them,
// with NaN in the padding so that an export that reads padding fails.
std::vector<RankState> shard_model(
    const std::vector<std::pair<std::string, spec::FlatParamLayout>>& layouts,
    const std::map<std::string, torch::Tensor>& originals, int world) {
  std::vector<RankState> ranks(world);
  for (size_t u = 0; u < layouts.size(); ++u) {
    const spec::FlatParamLayout& layout = layouts[u].second;
    std::vector<torch::Tensor> flat;
    for (const spec::FlatParamEntry& p : layout.params())
      flat.push_back(originals.at(p.name).reshape(-1));
    flat.push_back(torch::full({layout.padding_numel()}, std::numeric_limits<float>::quiet_NaN()));
    const torch::Tensor padded = torch::cat(flat);
    const int group = layout.world();
    for (int r = 0; r < world; ++r) {
      const int index = r % group;
      const std::string prefix = "unit" + std::to_string(u);
      const spec::ShardRange range = layout.shard(index);
      RankState& s = ranks[r];
      s.tensors[prefix + ".param_shard"] =
          padded.slice(0, range.offset, range.offset + range.size).clone();
      s.tensors[prefix + ".exp_avg"] = torch::randn({range.size});
      s.tensors[prefix + ".exp_avg_sq"] = torch::rand({range.size});
      s.units.push_back(
          UnitShardLayout::from(layouts[u].first, prefix + ".param_shard", layout, index));
      s.metadata["step"] = 10;
    }
  }
  return ranks;
}

void expect_same_tensors(const std::map<std::string, torch::Tensor>& got,
                         const std::map<std::string, torch::Tensor>& want) {
  std::set<std::string> got_names, want_names;
  for (const auto& kv : got) got_names.insert(kv.first);
  for (const auto& kv : want) want_names.insert(kv.first);
  ASSERT_EQ(got_names, want_names);
  for (const auto& [name, t] : want) EXPECT_TRUE(bit_equal(got.at(name), t)) << name;
}

// The safetensors file as a hand-written reader sees it.
void expect_valid_safetensors(const fs::path& path) {
  const std::string file = read_bytes(path);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header length " << n;
  ASSERT_LE(8 + n, file.size());
  const json header = json::parse(file.substr(8, n));  // throws if not JSON
  // {"format": "pt"} and one data checksum per tensor, all strings (what
  // Hugging Face's loaders accept and keep).
  const json& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.size(), header.size());  // format + one per tensor (the header also holds __metadata__)
  for (const auto& [key, value] : meta.items()) EXPECT_TRUE(value.is_string()) << key;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const uint64_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    uint64_t numel = 1;
    for (const json& d : entry.at("shape")) numel *= d.get<uint64_t>();
    EXPECT_EQ(entry.at("dtype"), "F32") << name;
    EXPECT_EQ(end - begin, numel * 4) << name;
    spans.emplace_back(begin, end);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [begin, end] : spans) {
    EXPECT_EQ(begin, at);
    at = end;
  }
  EXPECT_EQ(at, file.size() - 8 - n) << "offsets must tile the data section exactly";
}

TEST(CheckpointTest, ExportConsolidatesGpt2TinyFromThreeShards) {
  const std::vector<spec::ModuleNode> modules =
      models::module_table(models::resolve_model("gpt2-tiny"));
  const spec::UnitPartition partition =
      spec::wrap_modules(modules, spec::WrapPolicy::parse("block"));
  const int world = 3;
  std::vector<std::pair<std::string, spec::FlatParamLayout>> layouts;
  std::map<std::string, torch::Tensor> originals;
  torch::manual_seed(0);
  bool padded = false, split = false;
  for (const spec::Unit& unit : partition.units) {
    layouts.emplace_back(unit.name, spec::FlatParamLayout(unit.params, world));
    const spec::FlatParamLayout& layout = layouts.back().second;
    padded |= layout.padding_numel() > 0;
    split |= layout.pieces(0).back().param == layout.pieces(1).front().param;
    for (const spec::ParamInfo& p : unit.params) originals[p.name] = torch::randn(p.shape);
  }
  // The cases worth testing occur: a unit with padding, a parameter cut by a
  // shard boundary, and GPT-2's tied embedding held once.
  ASSERT_TRUE(padded);
  ASSERT_TRUE(split);
  ASSERT_TRUE(originals.count("transformer.wte.weight"));
  ASSERT_FALSE(originals.count("lm_head.weight"));

  TempDir dir;
  save_committed(dir.path(), shard_model(layouts, originals, world));
  const fs::path out = dir.path() / "model.safetensors";
  export_safetensors(dir.path(), out);
  expect_same_tensors(read_safetensors(out), originals);
  expect_valid_safetensors(out);
}

TEST(CheckpointTest, ExportHandlesReplicatedAndHybridShards) {
  const std::map<std::string, torch::Tensor> originals = {{"a.weight", torch::randn({2, 3})},
                                                          {"a.bias", torch::randn({5})}};
  // world 4: ddp (one shard, replicated), hybrid (2 per node), full sharding.
  for (int group : {1, 2, 4}) {
    SCOPED_TRACE("shard group " + std::to_string(group));
    TempDir dir;
    save_committed(dir.path(), shard_model({{"a", small_layout(group)}}, originals, 4));
    export_safetensors(dir.path(), dir.path() / "a.safetensors");
    expect_same_tensors(read_safetensors(dir.path() / "a.safetensors"), originals);
  }
}

TEST(CheckpointTest, SafetensorsRoundTripAndDamagedFiles) {
  TempDir dir;
  const fs::path path = dir.path() / "t.safetensors";
  const std::map<std::string, torch::Tensor> tensors = {{"w", torch::randn({3, 4})},
                                                        {"h", torch::randn({5}).to(torch::kHalf)},
                                                        {"i", torch::arange(6)}};
  write_safetensors(path, tensors);
  expect_same_tensors(read_safetensors(path), tensors);

  auto with_header = [&](const std::string& text, const std::string& data) {
    std::string file(8, '\0');
    const uint64_t n = text.size();
    std::memcpy(file.data(), &n, 8);
    write_bytes(path, file + text + data);
  };
  with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
              std::string(8, '\0'));
  expect_error([&] { read_safetensors(path); }, path, "no gap or overlap");
  with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0'));
  expect_error([&] { read_safetensors(path); }, path, "(truncated or corrupt)");
  write_bytes(path, std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10));
  expect_error([&] { read_safetensors(path); }, path, "header length");
}

}  // namespace
}  // namespace shardfit::executor
