// Integrity: what a user gets back from a checkpoint is what was
// saved, or an error naming the file and the tensor. The binary as a
// subprocess (two gloo ranks of gpt2-tiny), every run bounded by timeout(1).
// No LibTorch here; files are read and damaged by hand.
//  - corrupted tensor data in a committed checkpoint is refused on resume
//    (exit 2 naming the rank file and the tensor), found by `shardfit
//    verify`, and an exported safetensors file carries and checks its own
//    checksums in __metadata__;
//  - resume refuses an option change that breaks the bit-exact promise,
//    unless --resume-anyway, which the report records;
//  - a NaN/Inf loss stops the run: exit 1, "diverged at step N", report
//    written (unless --allow-nonfinite);
//  - litter of killed saves goes at the next save; resumed_from names the
//    checkpoint resumed even when saving into the same root.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
using Args = std::vector<std::string>;

fs::path test_dir() { return shardfit::test_support::test_dir("integrity"); }
using shardfit::test_support::read_file;
using shardfit::test_support::Result;

// Bounded: timeout(1) ends a hung job (and its ranks) after 120 s.
Result shardfit(const fs::path&, const Args& args) { return shardfit::test_support::shardfit(args, "", 120); }

Args job(int steps, const Args& more = {}) {
  Args a = {"run",
            "--model",
            "gpt2-tiny",
            "--strategy",
            "zero2/fp32/wrap=block",
            "--nproc",
            "2",
            "--batch",
            "2",
            "--seq-len",
            "32",
            "--steps",
            std::to_string(steps),
            "--timeout",
            "60"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Overwrites the last `n` floats of a file with 1e30 (a damage once found by hand).
void clobber_tail(const fs::path& file, int n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  f.seekp(-static_cast<std::streamoff>(n * sizeof(float)), std::ios::end);
  const float big = 1e30f;
  for (int i = 0; i < n; ++i) f.write(reinterpret_cast<const char*>(&big), sizeof big);
}

// Saves steps 1..2 of the zero2 job under dir/k; returns the step dir.
fs::path saved_checkpoint(const fs::path& dir) {
  const Result r = shardfit(dir, job(2, {"--save", (dir / "k").string()}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir / "k" / "step-000002";
}

TEST(Integrity, CorruptedTensorDataIsRefusedOnResumeNamingFileAndTensor) {
  const fs::path dir = test_dir();
  const fs::path step = saved_checkpoint(dir);
  clobber_tail(step / "rank-1-of-2.shardfit", 8);
  const Result r = shardfit(dir, job(4, {"--resume", step.string()}));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("rank-1-of-2.shardfit"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tensor '"), std::string::npos) << r.err;
  // Found before any rank started: one line, nothing trained.
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Integrity, VerifyChecksACheckpointAndNamesTheCorruptFileAndTensor) {
  const fs::path dir = test_dir();
  const fs::path step = saved_checkpoint(dir);
  Result ok = shardfit(dir, {"verify", step.string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("ok: checkpoint"), std::string::npos) << ok.out;
  ok = shardfit(dir, {"verify", (step / "rank-0-of-2.shardfit").string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  clobber_tail(step / "rank-0-of-2.shardfit", 1);
  for (const fs::path& p : {step, step / "rank-0-of-2.shardfit"}) {
    const Result bad = shardfit(dir, {"verify", p.string()});
    EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
    EXPECT_EQ(lines(bad.err), 1u) << bad.err;
    EXPECT_NE(bad.err.find("rank-0-of-2.shardfit: tensor '"), std::string::npos) << bad.err;
  }
  const Result missing = shardfit(dir, {"verify", (dir / "nope").string()});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  fs::remove_all(dir);
}

// The manifest's job and layout (step, learning rate, shapes, the
// optimizer-state list) are rank 0's header's: an edit to any of them passed
// verify and resumed; now both refuse it in one line naming the manifest.
TEST(Integrity, AnEditedManifestFailsVerifyAndResume) {
  const fs::path dir = test_dir();
  const fs::path step = saved_checkpoint(dir);
  const fs::path manifest = step / "manifest.json";
  const std::string original = read_file(manifest);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"step\": 2", "\"step\": 7"}, {"\"lr\": 0.0006", "\"lr\": 0.06"}}) {
    const size_t at = original.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in\n" << original;
    std::ofstream(manifest, std::ios::trunc) << original.substr(0, at) + to + original.substr(at + from.size());
    const Result v = shardfit(dir, {"verify", step.string()});
    EXPECT_EQ(v.exit_code, 2) << to << ": " << v.out << v.err;
    EXPECT_NE(v.err.find("manifest.metadata differs"), std::string::npos) << v.err;
    EXPECT_EQ(lines(v.err), 1u) << v.err;
    const Result r = shardfit(dir, job(4, {"--resume", step.string()}));
    EXPECT_EQ(r.exit_code, 2) << to << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("manifest.metadata differs"), std::string::npos) << r.err;
  }
  fs::remove_all(dir);
}

// A manifest field added by hand, or a rank entry without the hash that pins
// its file (no shardfit manifest lacks one), is an edit: verify and resume
// refuse it in one line naming the manifest, before any rank starts.
TEST(Integrity, AManifestWithAnAddedFieldOrWithoutItsHashIsRefused) {
  const fs::path dir = test_dir();
  const fs::path step = saved_checkpoint(dir);
  const fs::path manifest = step / "manifest.json";
  const json original = json::parse(read_file(manifest));
  json added = original;
  added["note"] = "edited by hand";
  json unpinned = original;
  unpinned["ranks"][1].erase("header_fnv1a64");
  json no_units = original;
  no_units.erase("units");
  for (const auto& [edited, names] : std::vector<std::pair<json, std::string>>{
           {added, "field 'note'"}, {unpinned, "manifest.ranks[1] has no header_fnv1a64"}, {no_units, "no 'units'"}}) {
    std::ofstream(manifest, std::ios::trunc) << edited.dump(2);
    const Result v = shardfit(dir, {"verify", step.string()});
    EXPECT_EQ(v.exit_code, 2) << names << ": " << v.out << v.err;
    EXPECT_NE(v.err.find("manifest.json: "), std::string::npos) << v.err;
    EXPECT_NE(v.err.find(names), std::string::npos) << v.err;
    EXPECT_EQ(lines(v.err), 1u) << v.err;
    const Result r = shardfit(dir, job(4, {"--resume", step.string()}));
    EXPECT_EQ(r.exit_code, 2) << names << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(names), std::string::npos) << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
  }
  std::ofstream(manifest, std::ios::trunc) << original.dump(2);
  EXPECT_EQ(shardfit(dir, {"verify", step.string()}).exit_code, 0);
  fs::remove_all(dir);
}

// `file` rewritten without shardfit's checksums, as a Hugging Face file is.
void strip_checksums(const fs::path& file) {
  const std::string bytes = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << text << bytes.substr(8 + n);
}

// A file without checksums has nothing to check its bytes against, but no
// trained weight is NaN: --init reads every value of such a file before any
// rank starts, says that it did, and refuses a NaN in one line (it trained
// from it with exit 0).
TEST(Integrity, InitFromAFileWithoutChecksumsChecksEveryValueAndSaysSo) {
  const fs::path dir = test_dir();
  const fs::path out = dir / "model.safetensors";
  ASSERT_EQ(shardfit(dir, job(2, {"--save", (dir / "k").string(), "--export", out.string()})).exit_code, 0);
  strip_checksums(out);
  const Result plain = shardfit(dir, job(1, {"--init", out.string()}));
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  const size_t said = plain.err.find("no shardfit checksums");
  EXPECT_NE(said, std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("no shardfit checksums", said + 1), std::string::npos) << "read twice:\n" << plain.err;
  {
    std::fstream f(out, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-static_cast<std::streamoff>(sizeof(float)), std::ios::end);
    const uint32_t nan = 0x7fc00000u;
    f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  const Result bad = shardfit(dir, job(1, {"--init", out.string()}));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("model.safetensors: tensor '"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("NaN or Inf"), std::string::npos) << bad.err;
  EXPECT_EQ(lines(bad.err), 1u) << bad.err;
  EXPECT_EQ(bad.out.find("step 1"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

TEST(Integrity, ExportedSafetensorsCarryChecksumsInMetadataAndVerify) {
  const fs::path dir = test_dir();
  const fs::path out = dir / "model.safetensors";
  const Result r =
      shardfit(dir, job(2, {"--save", (dir / "k").string(), "--export", out.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Header: every tensor has "shardfit.xxh3.<name>" in __metadata__, and
  // the metadata stays a string -> string map (Hugging Face loads it).
  const std::string bytes = read_file(out);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  const json& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "pt");
  size_t tensors = 0;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    ++tensors;
    ASSERT_TRUE(meta.contains("shardfit.xxh3." + name)) << name;
    EXPECT_EQ(meta.at("shardfit.xxh3." + name).get<std::string>().size(), 16u);
  }
  EXPECT_GT(tensors, 10u);
  EXPECT_EQ(shardfit(dir, {"verify", out.string()}).exit_code, 0);

  // The intact export starts a run (--init reads it back).
  EXPECT_EQ(shardfit(dir, job(1, {"--init", out.string()})).exit_code, 0);

  clobber_tail(out, 1);
  const Result bad = shardfit(dir, {"verify", out.string()});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("model.safetensors: tensor '"), std::string::npos) << bad.err;
  // --init checks the same checksums before any rank starts: one line, exit
  // 2, naming the file and the tensor (it trained from the damaged file).
  const Result init = shardfit(dir, job(1, {"--init", out.string()}));
  EXPECT_EQ(init.exit_code, 2) << init.err;
  EXPECT_NE(init.err.find("model.safetensors: tensor '"), std::string::npos) << init.err;
  EXPECT_EQ(lines(init.err), 1u) << init.err;
  EXPECT_EQ(init.out.find("step 1"), std::string::npos) << init.out;
  fs::remove_all(dir);
}

// `a` with option `opt` set to `value` (replaced where job() has it).
Args with(Args a, const std::string& opt, const std::string& value) {
  const auto it = std::find(a.begin(), a.end(), opt);
  if (it != a.end()) {
    *(it + 1) = value;
  } else {
    a.push_back(opt);
    a.push_back(value);
  }
  return a;
}

TEST(Integrity, ResumeRefusesOptionChangesThatBreakBitExactness) {
  const fs::path dir = test_dir();
  const fs::path step = saved_checkpoint(dir);
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"--batch", "1"},  {"--seed", "7"}, {"--lr", "0.01"}, {"--seq-len", "16"},
      {"--strategy", "zero2/bf16/wrap=block"}};
  for (const auto& [opt, value] : changes) {
    const Result r = shardfit(dir, with(job(4, {"--resume", step.string()}), opt, value));
    EXPECT_EQ(r.exit_code, 2) << opt << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find(opt + " "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--resume-anyway"), std::string::npos) << r.err;
  }

  // --resume-anyway trains, and the report says what changed.
  const Result r = shardfit(dir, job(4, {"--resume", step.string(), "--seed", "7",
                                         "--resume-anyway", "--out", (dir / "r.json").string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(read_file(dir / "r.json"));
  ASSERT_EQ(report["run"]["resume_changes"].size(), 1u) << report["run"].dump();
  EXPECT_EQ(report["run"]["resume_changes"][0], "--seed 1234 -> 7");
  fs::remove_all(dir);
}

TEST(Integrity, ANonFiniteLossStopsTheRunWithExitOneAndAReport) {
  const fs::path dir = test_dir();
  // An absurd learning rate: finite, accepted, and the weights blow up.
  const Result r = shardfit(dir, job(6, {"--lr", "1e30", "--out", (dir / "r.json").string()}));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("diverged at step "), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(dir / "r.json"));
  const json report = json::parse(read_file(dir / "r.json"));
  const int64_t at = report["run"]["diverged_at_step"].get<int64_t>();
  EXPECT_GE(at, 2);
  EXPECT_LE(at, 6);
  EXPECT_EQ(report["run"]["loss"].size(), static_cast<size_t>(at));
  EXPECT_EQ(shardfit(dir, {"compare", (dir / "r.json").string()}).exit_code != 2, true);

  const Result on = shardfit(dir, job(6, {"--lr", "1e30", "--allow-nonfinite"}));
  EXPECT_EQ(on.exit_code, 0) << on.err;
  fs::remove_all(dir);
}

TEST(Integrity, LitterOfKilledSavesIsRemovedAtTheNextSave) {
  const fs::path dir = test_dir();
  const fs::path root = dir / "k";
  const fs::path step = saved_checkpoint(dir);
  // What a save killed midway leaves: a step dir without a manifest, and a
  // temporary file beside a committed one.
  fs::create_directories(root / "step-000001");
  std::ofstream(root / "step-000001" / "rank-0-of-2.shardfit.tmp.4242") << "partial";
  std::ofstream(step / "rank-1-of-2.shardfit.tmp.4243") << "partial";
  const Result r = shardfit(dir, job(4, {"--resume", root.string(), "--save", root.string(),
                                         "--out", (dir / "r.json").string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(root / "step-000001"));
  EXPECT_FALSE(fs::exists(step / "rank-1-of-2.shardfit.tmp.4243"));
  EXPECT_TRUE(fs::exists(step / "manifest.json"));
  EXPECT_TRUE(fs::exists(root / "step-000004" / "manifest.json"));
  // Resumed into the same root: the report names step 2, not the new step 4.
  const json report = json::parse(read_file(dir / "r.json"));
  EXPECT_EQ(report["run"]["resumed_from"], step.string());
  fs::remove_all(dir);
}

TEST(Integrity, SaveAndExportPathsAreCheckedBeforeTraining) {
  const fs::path dir = test_dir();
  std::ofstream(dir / "file") << "x";
  Result r = shardfit(dir, job(50, {"--save", (dir / "file").string()}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--save"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("loss"), std::string::npos) << "trained before checking --save";
  r = shardfit(dir, job(50, {"--save", (dir / "k").string(), "--export",
                             (dir / "no" / "m.safetensors").string()}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--export"), std::string::npos) << r.err;
  r = shardfit(dir, job(50, {"--save", (dir / "k").string(), "--export", dir.string()}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  fs::remove_all(dir);
}

}  // namespace
