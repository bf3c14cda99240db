// Reading shardfit checkpoints and safetensors headers without LibTorch:
// the rank-file header and tensor table, the manifest, the unit layouts,
// and the data checksums (`shardfit verify`). executor/checkpoint.cc and
// executor/safetensors.cc read tensors through these; tests/fuzz feeds them
// arbitrary bytes. Every problem is std::invalid_argument, one line that
// starts with the file's path (and names the tensor for a checksum).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/checkpoint_io.h"
#include "executor/checkpoint_layout.h"

namespace shardfit::executor::ckpt {

constexpr char kRankMagic[8] = {'S', 'H', 'R', 'D', 'F', 'I', 'T', '1'};
constexpr int64_t kRankPreambleBytes = 16;  // magic + header length
constexpr const char* kRankFormat = "shardfit.rank/1";
constexpr const char* kManifestFormat = "shardfit.checkpoint/1";
constexpr const char* kManifestName = "manifest.json";
// Exported safetensors carry each tensor's data checksum in __metadata__
// under this prefix + the tensor's name (values must be strings there).
constexpr const char* kSafetensorsChecksumPrefix = "shardfit.xxh3.";

// ----------------------------------------------------------- unit layouts

struct TensorSig {
  const DTypeInfo* dtype;
  std::vector<int64_t> shape;
};

json unit_to_json(const UnitShardLayout& u, bool with_shard);
UnitShardLayout unit_from_json(const fs::path& file, const json& j, const std::string& where);
// Every unit follows the padding rule and its param_tensor is a 1-D
// floating tensor of shard_numel elements; unit and parameter names are
// unique.
void check_units(const fs::path& file, int world_size, const std::vector<UnitShardLayout>& units,
                 const std::map<std::string, TensorSig>& tensors);

// ------------------------------------------------------------- rank files

// A rank file's header, read and checked; the data is read on demand.
struct RankFile {
  explicit RankFile(const fs::path& path) : file(path) {}
  ReadFile file;
  int rank = 0;
  int world_size = 0;
  json metadata;
  std::vector<UnitShardLayout> units;
  std::vector<TensorEntry> tensors;  // in data order; each with its checksum
  int64_t data_start = 0;
  std::string header_hash;  // fnv1a64 of the header bytes, hex

  const TensorEntry& tensor(const std::string& name) const;
};

// rank < 0: whatever rank and world size the header says (`shardfit verify
// FILE`); otherwise they must match.
RankFile read_rank_header(const fs::path& path, int rank, int world_size);
// Checks every tensor's data against its checksum; returns the bytes read.
int64_t verify_rank_data(const RankFile& rf);

// ---------------------------------------------------------------- manifest

struct ManifestRank {
  std::string file;
  int64_t bytes = 0;
  std::string header_hash;
};

struct Manifest {
  int world_size = 0;
  std::vector<ManifestRank> ranks;
};

Manifest read_manifest(const fs::path& dir);
Manifest read_manifest_for(const fs::path& dir, int world_size);
// A committed rank file: its header checked, and the file the one the
// manifest recorded.
RankFile open_committed_rank(const fs::path& dir, const Manifest& m, int rank);
void check_rank_args(int rank, int world_size);

// ------------------------------------------------------------- safetensors

struct SafetensorsHeader {
  int64_t data_start = 0;
  std::vector<TensorEntry> tensors;  // in data order; checksums from __metadata__, if any
  std::map<std::string, std::string> metadata;
  bool has_checksums = false;  // every tensor has one (a file has all or none)
};
SafetensorsHeader read_safetensors_header(const ReadFile& f);

// ------------------------------------------------------------ shardfit verify

struct VerifySummary {
  std::string what;  // "checkpoint", "rank file", "safetensors file"
  int files = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;  // data bytes checksummed
};
// A committed checkpoint directory (manifest, every rank file, every
// tensor's data), one rank file, or a safetensors file written by shardfit
// (its checksums in __metadata__). Throws std::invalid_argument naming the
// file (and the tensor) at the first problem.
VerifySummary verify_path(const fs::path& path);

}  // namespace shardfit::executor::ckpt
