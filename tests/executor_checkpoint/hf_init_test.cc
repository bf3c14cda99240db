// `shardfit run --init PATH` as a user drives it: the binary as a
// subprocess, checkpoints written by `--export` and rewritten by hand (no
// LibTorch here; safetensors is read and written with nlohmann::json).
//
//  - `--export`, then `--init` it, then `--export` again (lr 1e-50: the
//    weights stay as loaded) gives the same bytes, for llama-tiny, qwen-tiny,
//    gpt2-tiny and bert-tiny, also from a directory of two shards with
//    model.safetensors.index.json;
//  - a llama-tiny run started from another run's export continues its loss
//    curve (far below a fresh start);
//  - a missing, extra, misshapen or wrongly typed tensor is exit 2 with one
//    line naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/shardfit_process.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path test_dir() { return shardfit::test_support::test_dir("init"); }
using shardfit::test_support::read_file;
using shardfit::test_support::Result;

Result shardfit(const fs::path&, const std::vector<std::string>& args) {
  return shardfit::test_support::shardfit(args);
}

// Trains `model` and exports its last checkpoint to `exported`; returns the
// run's losses. `extra` adds options (--init, --lr 0, ...).
std::vector<double> train_and_export(const fs::path& dir, const std::string& model,
                                     const std::string& strategy, int nproc, int steps,
                                     const fs::path& exported,
                                     const std::vector<std::string>& extra = {}) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  std::vector<std::string> args = {"run",
                                   "--model",
                                   model,
                                   "--strategy",
                                   strategy,
                                   "--nproc",
                                   std::to_string(nproc),
                                   "--batch",
                                   "2",
                                   "--seq-len",
                                   "32",
                                   "--steps",
                                   std::to_string(steps),
                                   "--save",
                                   (dir / ("ckpt" + tag)).string(),
                                   "--export",
                                   exported.string(),
                                   "--out",
                                   (dir / ("report" + tag + ".json")).string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const Result r = shardfit(dir, args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  return json::parse(read_file(dir / ("report" + tag + ".json")))["run"]["loss"]
      .get<std::vector<double>>();
}

// A safetensors file: header JSON and data section.
struct Safetensors {
  json header;
  std::string data;
};

Safetensors parse(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void write(const fs::path& path, const json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << len << h << data;
}

TEST(HfInit, ExportInitExportIsTheSameBytes) {
  const fs::path dir = test_dir();
  for (const char* model : {"llama-tiny", "qwen-tiny", "gpt2-tiny", "bert-tiny"}) {
    SCOPED_TRACE(model);
    const fs::path a = dir / (std::string(model) + "-a.safetensors");
    const fs::path b = dir / (std::string(model) + "-b.safetensors");
    ASSERT_FALSE(train_and_export(dir, model, "zero3/fp32/wrap=block", 2, 2, a).empty());
    // lr 1e-50 (--lr must be > 0), no decay: AdamW's step size, a float in
    // the fp32 kernels, rounds to 0, so the weights stay those loaded (1e-30
    // still moved BERT's exactly-zero key biases, whose gradient is ~0).
    ASSERT_FALSE(train_and_export(dir, model, "ddp/fp32/wrap=none", 1, 1, b,
                                  {"--init", a.string(), "--lr", "1e-50", "--weight-decay", "0"})
                     .empty());
    EXPECT_TRUE(read_file(a) == read_file(b)) << a << " and " << b << " differ";
  }
}

TEST(HfInit, ShardedDirectoryWithIndexLoads) {
  const fs::path dir = test_dir();
  const fs::path a = dir / "a.safetensors", b = dir / "b.safetensors";
  ASSERT_FALSE(train_and_export(dir, "llama-tiny", "zero2/fp32/wrap=block", 2, 2, a).empty());
  // Two shards, tensors alternating, each with its own data section.
  const Safetensors st = parse(read_file(a));
  const fs::path sharded = dir / "sharded";
  fs::create_directories(sharded);
  json shard_header[2] = {json::object(), json::object()};
  std::string shard_data[2];
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  int i = 0;
  for (const auto& item : st.header.items()) {
    if (item.key() == "__metadata__") continue;
    const int s = i++ % 2;
    json t = item.value();
    const auto begin = t["data_offsets"][0].get<size_t>(), end = t["data_offsets"][1].get<size_t>();
    t["data_offsets"] = {shard_data[s].size(), shard_data[s].size() + (end - begin)};
    shard_data[s] += st.data.substr(begin, end - begin);
    shard_header[s][item.key()] = t;
    index["weight_map"][item.key()] =
        "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s)
    write(sharded / ("model-0000" + std::to_string(s + 1) + "-of-00002.safetensors"),
          shard_header[s], shard_data[s]);
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump(2);
  ASSERT_FALSE(
      train_and_export(dir, "llama-tiny", "zero3/fp32/wrap=block", 2, 1, b,
                       {"--init", sharded.string(), "--lr", "1e-50", "--weight-decay", "0"})
          .empty());
  EXPECT_TRUE(read_file(a) == read_file(b));
}

TEST(HfInit, ARunFromAnExportContinuesTheLossCurve) {
  const fs::path dir = test_dir();
  const fs::path a = dir / "a.safetensors", unused = dir / "unused.safetensors";
  const auto fresh =
      train_and_export(dir, "llama-tiny", "zero3/fp32/wrap=block", 2, 20, a, {"--lr", "3e-3"});
  const auto resumed = train_and_export(dir, "llama-tiny", "ddp/fp32/wrap=none", 2, 3, unused,
                                        {"--init", a.string(), "--lr", "3e-3"});
  ASSERT_EQ(fresh.size(), 20u);
  ASSERT_EQ(resumed.size(), 3u);
  // The fresh run starts at ln(512) = 6.24; the continued one where the
  // first left off, well below it (new optimizer state, same weights).
  EXPECT_LT(resumed[0], fresh[0] - 0.5)
      << "fresh " << fresh[0] << " ... " << fresh[19] << ", from the export " << resumed[0];
  EXPECT_LT(resumed[0], 0.5 * (fresh[0] + fresh[19]))
      << "closer to where the first run ended than began";
}

TEST(HfInit, BadCheckpointsAreExitTwoNamingTheTensor) {
  const fs::path dir = test_dir();
  const fs::path a = dir / "a.safetensors";
  ASSERT_FALSE(train_and_export(dir, "llama-tiny", "ddp/fp32/wrap=none", 1, 1, a).empty());
  const Safetensors st = parse(read_file(a));
  const std::string victim = "model.layers.0.self_attn.k_proj.weight";
  ASSERT_TRUE(st.header.contains(victim));

  auto expect_refused = [&](const json& header, const std::string& must_name,
                            const std::string& what) {
    SCOPED_TRACE(what);
    const fs::path bad = dir / (what + ".safetensors");
    write(bad, header, st.data);
    const Result r = shardfit(dir, {"run", "--model", "llama-tiny", "--steps", "1", "--batch", "1",
                                    "--seq-len", "16", "--init", bad.string()});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(must_name), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--init"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  json missing = st.header;
  missing.erase(victim);
  expect_refused(missing, victim, "missing");
  json extra = st.header;
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = st.header[victim];
  expect_refused(extra, "rotary_emb.inv_freq", "extra");
  json shape = st.header;
  shape[victim]["shape"] = {64, 32};
  expect_refused(shape, victim, "shape");
  json dtype = st.header;
  dtype[victim]["dtype"] = "I32";
  expect_refused(dtype, victim, "dtype");
  // Another model's weights: qwen-tiny's vocabulary is 509, not 512.
  const Result r =
      shardfit(dir, {"run", "--model", "qwen-tiny", "--steps", "1", "--init", a.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("model.embed_tokens.weight"), std::string::npos) << r.err;
}

}  // namespace
