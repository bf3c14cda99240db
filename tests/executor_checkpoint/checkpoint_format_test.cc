// The LibTorch-free readers of outside input: checkpoint rank
// files and safetensors with their data checksums, the llm.c token-file
// header, the model config bounds. Files are crafted byte by byte here, so
// each check is pinned to the format, not to what the writer happens to do.
// Built in the normal build and in the ASan+UBSan one (scripts/fuzz).
#include "executor/checkpoint_format.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/token_file.h"
#include "models/model_config.h"

namespace {

namespace fs = std::filesystem;
namespace ckpt = shardfit::executor::ckpt;
using nlohmann::json;

fs::path temp_file(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fs::temp_directory_path() / ("shardfit_fmt_" + std::string(info->name()) + "_" + name);
}

std::string u64le(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string padded(std::string header, size_t preamble) {
  while ((preamble + header.size()) % 8) header.push_back(' ');
  return header;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// Two F32 tensors a = [1, 2], b = [3]; `sums`: write their checksums.
std::string safetensors(bool sums, bool only_a = false) {
  const std::string a = floats({1, 2}), b = floats({3});
  json h = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
            {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}}};
  json meta = {{"format", "pt"}};
  if (sums) {
    meta["shardfit.xxh3.a"] = ckpt::xxh3_hex(a.data(), a.size());
    if (!only_a) meta["shardfit.xxh3.b"] = ckpt::xxh3_hex(b.data(), b.size());
  }
  h["__metadata__"] = meta;
  const std::string text = padded(h.dump(), 8);
  return u64le(text.size()) + text + a + b;
}

TEST(CheckpointFormat, SafetensorsChecksumsVerifyAndAMismatchNamesTheTensor) {
  const fs::path p = temp_file("m.safetensors");
  std::string bytes = safetensors(true);
  write(p, bytes);
  const ckpt::VerifySummary s = ckpt::verify_path(p);
  EXPECT_EQ(s.tensors, 2);
  EXPECT_EQ(s.bytes, 12);
  bytes[bytes.size() - 1] ^= 1;  // b's last byte
  write(p, bytes);
  try {
    ckpt::verify_path(p);
    ADD_FAILURE() << "a flipped bit passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": tensor 'b': data checksum mismatch"),
              std::string::npos)
        << e.what();
  }
  fs::remove(p);
}

TEST(CheckpointFormat, SafetensorsWithoutOrWithPartialChecksumsIsNotVerifiable) {
  const fs::path p = temp_file("m.safetensors");
  write(p, safetensors(false));
  EXPECT_THROW(ckpt::verify_path(p), std::invalid_argument);
  write(p, safetensors(true, /*only_a=*/true));
  EXPECT_THROW(ckpt::verify_path(p), std::invalid_argument);
  fs::remove(p);
}

// A rank file of one tensor "x" = [5, 6] and no units.
std::string rank_file(bool with_sum, int rank = 0, int world = 1) {
  const std::string data = floats({5, 6});
  json t = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  if (with_sum) t["xxh3"] = ckpt::xxh3_hex(data.data(), data.size());
  const json h = {{"format", "shardfit.rank/1"},
                  {"rank", rank},
                  {"world_size", world},
                  {"metadata", json::object()},
                  {"units", json::array()},
                  {"tensors", {{"x", t}}},
                  {"data_bytes", 8}};
  const std::string text = padded(h.dump(), 16);
  return std::string("SHRDFIT1", 8) + u64le(text.size()) + text + data;
}

TEST(CheckpointFormat, RankFileDataIsCheckedAgainstItsChecksum) {
  const fs::path p = temp_file("rank-0-of-1.shardfit");
  std::string bytes = rank_file(true);
  write(p, bytes);
  EXPECT_EQ(ckpt::verify_path(p).tensors, 1);
  bytes[bytes.size() - 2] ^= 0x40;
  write(p, bytes);
  EXPECT_THROW(
      {
        try {
          ckpt::verify_path(p);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("tensor 'x': data checksum mismatch"),
                    std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  fs::remove(p);
}

TEST(CheckpointFormat, RankFileWithoutChecksumsOrWithAHugeHeaderIsRefused) {
  const fs::path p = temp_file("r.shardfit");
  write(p, rank_file(false));
  EXPECT_THROW(ckpt::read_rank_header(p, 0, 1), std::invalid_argument);
  // A header length of 2^63: refused before anything is allocated for it.
  write(p, std::string("SHRDFIT1", 8) + u64le(uint64_t{1} << 63));
  EXPECT_THROW(ckpt::read_rank_header(p, -1, 0), std::invalid_argument);
  // A rank the world does not have.
  write(p, rank_file(true, 3, 2));
  EXPECT_THROW(ckpt::read_rank_header(p, -1, 0), std::invalid_argument);
  fs::remove(p);
}

TEST(TokenFileHeader, BadMagicVersionCountOrSizeIsInvalidArgument) {
  int32_t h[shardfit::executor::kLlmcHeaderInts] = {};
  h[0] = shardfit::executor::kLlmcMagic;
  h[1] = 1;
  h[2] = 100;
  EXPECT_EQ(shardfit::executor::check_llmc_header(h, 1024 + 200, 10, "t"), 100);
  EXPECT_THROW(shardfit::executor::check_llmc_header(h, 1024 + 198, 10, "t"),
               std::invalid_argument);  // truncated
  EXPECT_THROW(shardfit::executor::check_llmc_header(h, 1000, 10, "t"), std::invalid_argument);
  EXPECT_THROW(shardfit::executor::check_llmc_header(h, 1024 + 200, 101, "t"),
               std::invalid_argument);
  h[2] = -5;
  EXPECT_THROW(shardfit::executor::check_llmc_header(h, 1024 + 200, 1, "t"), std::invalid_argument);
  h[2] = 100;
  h[0] = 7;
  EXPECT_THROW(shardfit::executor::check_llmc_header(h, 1024 + 200, 10, "t"),
               std::invalid_argument);
}

TEST(ModelConfigBounds, OutOfBoundsSizesAreRefusedAtOnceNamingTheKey) {
  const auto start = std::chrono::steady_clock::now();
  auto refused = [](const std::string& text, const std::string& key) {
    try {
      shardfit::models::parse_hf_config(text, "c.json");
      ADD_FAILURE() << text << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
    }
  };
  refused(R"({"model_type": "gpt2", "n_layer": 1000000000})", "n_layer");
  refused(R"({"model_type": "gpt2", "n_embd": 1000000000, "n_head": 1})", "n_embd");
  refused(R"({"model_type": "gpt2", "vocab_size": 9223372036854775807})", "vocab_size");
  refused(R"({"model_type": "gpt2", "layer_norm_epsilon": -1e-5})", "layer_norm_epsilon");
  refused(R"({"model_type": "gpt2", "initializer_range": -0.02})", "initializer_range");
  refused(R"({"model_type": "bert", "type_vocab_size": 1})", "type_vocab_size");
  // fuzz_config's first crash: a number beyond a double is out_of_range, not
  // a parse_error; it escaped as an internal error (exit 3).
  EXPECT_THROW(shardfit::models::parse_hf_config(R"({"model_type": "gpt2", "n_layer": 1e48287957141})", "c"),
               std::invalid_argument);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  // The published sizes stay accepted.
  EXPECT_NO_THROW(
      shardfit::models::parse_hf_config(R"({"model_type": "gpt2", "n_embd": 1600, "n_layer": 48,
                                                       "n_head": 25})",
                                        "gpt2-xl.json"));
}

}  // namespace
