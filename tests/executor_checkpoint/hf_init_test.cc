// `shardfit run --init PATH` as a user drives it: the binary as a
// subprocess, checkpoints written by `--export` and rewritten by hand (no
// LibTorch here; safetensors is read and written with nlohmann::json).
//
//  - `--export`, then `--init` it, then `--export` again (lr 1e-50: the
//    weights stay as loaded) gives the same bytes, for llama-tiny, qwen-tiny,
//    gpt2-tiny and bert-tiny, also from a directory of two shards with
//    model.safetensors.index.json;
//  - each rank reads only its own shard's bytes (zero3: the ranks' reads
//    add up to the checkpoint, ddp: every rank reads it all; the report
//    says so) and holds at init exactly what the plan predicts; a BF16
//    checkpoint, read piece by piece at element offsets, loads as its
//    values widened to fp32, bit for bit;
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

// A well-formed file as another tool would write it: `header`'s tensors,
// each one's bytes taken from `data` at its offsets there, renumbered to tile
// the data section (safetensors allows no gap or overlap), and no shardfit
// checksums in __metadata__.
void write_tiled(const fs::path& path, json header, const std::string& data) {
  std::vector<std::pair<size_t, std::string>> order;  // (old begin, name)
  for (const auto& item : header.items())
    if (item.key() != "__metadata__") order.emplace_back(item.value()["data_offsets"][0].get<size_t>(), item.key());
  std::sort(order.begin(), order.end());
  std::string tiled;
  for (const auto& [begin, name] : order) {
    const size_t end = header[name]["data_offsets"][1].get<size_t>();
    header[name]["data_offsets"] = {tiled.size(), tiled.size() + (end - begin)};
    tiled += data.substr(begin, end - begin);
  }
  header["__metadata__"] = {{"format", "pt"}};
  write(path, header, tiled);
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

// The report of a run with `--init`, and the exit code.
json init_report(const fs::path& dir, const std::string& strategy, int nproc, const fs::path& init,
                 const std::string& tag, const fs::path& exported = {}) {
  std::vector<std::string> args = {"run", "--model", "llama-tiny", "--strategy", strategy, "--nproc",
                                   std::to_string(nproc), "--batch", "2", "--seq-len", "32", "--steps", "1",
                                   "--init", init.string(), "--lr", "1e-50", "--weight-decay", "0",
                                   "--out", (dir / (tag + ".json")).string()};
  if (nproc > 2) args.push_back("--oversubscribe");  // CI has 2 cores
  if (!exported.empty()) {
    for (const std::string& a : {std::string("--save"), (dir / ("ckpt-" + tag)).string(), std::string("--export"),
                                 exported.string()})
      args.push_back(a);
  }
  const Result r = shardfit(dir, args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return json();
  return json::parse(read_file(dir / (tag + ".json")));
}

TEST(HfInit, EachRankReadsOnlyItsOwnShard) {
  const fs::path dir = test_dir();
  const fs::path a = dir / "a.safetensors";
  ASSERT_FALSE(train_and_export(dir, "llama-tiny", "ddp/fp32/wrap=none", 1, 1, a).empty());
  const auto data_bytes = static_cast<int64_t>(parse(read_file(a)).data.size());
  for (const auto& [strategy, nproc] : {std::pair{"zero3/fp32/wrap=block", 2}, std::pair{"zero2/fp32/wrap=block", 3},
                                        std::pair{"ddp/fp32/wrap=none", 2}}) {
    SCOPED_TRACE(strategy);
    const json report = init_report(dir, strategy, nproc, a, "read-" + std::to_string(nproc));
    ASSERT_TRUE(report.is_object());
    EXPECT_EQ(report["run"]["init"]["data_bytes"].get<int64_t>(), data_bytes);
    int64_t sum = 0;
    for (const json& rank : report["ranks"]) {
      const auto read = rank["init_read_bytes"].get<int64_t>();
      sum += read;
      if (std::string(strategy).rfind("ddp", 0) == 0) {
        EXPECT_EQ(read, data_bytes) << "ddp keeps every parameter on every rank";
      } else {
        EXPECT_LT(read, data_bytes) << "rank " << rank["rank"] << " read the whole model";
        // Shards are ceil(numel / world) elements per unit: a rank reads at most that.
        EXPECT_LE(read, data_bytes / nproc + 4 * 16) << "rank " << rank["rank"];
      }
      // What init holds on the device is what the plan charges for it.
      auto at_init = [](const json& timeline) {
        for (const json& t : timeline)
          if (t["phase"] == "init") return t["allocated_bytes"].get<int64_t>();
        return int64_t{-1};
      };
      const int64_t measured = at_init(rank["measured"]["timeline"]);
      EXPECT_GT(measured, 0);
      EXPECT_EQ(measured, at_init(rank["predicted"]["timeline"])) << "rank " << rank["rank"];
    }
    if (std::string(strategy).rfind("ddp", 0) != 0) {
      EXPECT_EQ(sum, data_bytes) << "the shards tile the model";
    }
  }
}

TEST(HfInit, ABf16CheckpointLoadsAsItsValuesWidened) {
  const fs::path dir = test_dir();
  const fs::path a = dir / "a.safetensors", half = dir / "a-bf16.safetensors", b = dir / "b.safetensors";
  ASSERT_FALSE(train_and_export(dir, "llama-tiny", "zero3/fp32/wrap=block", 2, 2, a).empty());
  // BF16 is a float's upper 16 bits (little-endian: bytes 2 and 3).
  Safetensors st = parse(read_file(a));
  json header = st.header;
  std::string data, widened(st.data.size(), '\0');
  for (const auto& item : st.header.items()) {
    if (item.key() == "__metadata__") continue;
    const auto begin = item.value()["data_offsets"][0].get<size_t>();
    const auto end = item.value()["data_offsets"][1].get<size_t>();
    header[item.key()]["dtype"] = "BF16";
    header[item.key()]["data_offsets"] = {begin / 2, end / 2};
  }
  header.erase("__metadata__");  // its checksums are the fp32 data's
  data.resize(st.data.size() / 2);
  for (size_t i = 0; i < st.data.size(); i += 4) {
    data[i / 2] = st.data[i + 2];
    data[i / 2 + 1] = st.data[i + 3];
    widened[i + 2] = st.data[i + 2];
    widened[i + 3] = st.data[i + 3];
  }
  write(half, header, data);
  const json report = init_report(dir, "zero3/fp32/wrap=block", 2, half, "bf16", b);
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["run"]["init"]["data_bytes"].get<int64_t>(), static_cast<int64_t>(data.size()));
  const Safetensors out = parse(read_file(b));
  EXPECT_TRUE(out.data == widened) << "the exported fp32 values are not the BF16 ones widened";
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
    write_tiled(bad, header, st.data);
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
