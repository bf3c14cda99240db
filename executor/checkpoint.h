// Sharded checkpoints. Every rank saves and loads its own shards (flat
// parameter shard, AdamW state shards: whatever tensors the caller names)
// with its training scalars and the layout saying how its shards cut the
// model's parameters, so that export_safetensors can consolidate a
// checkpoint into one Hugging Face `.safetensors` file without building the
// model. No communicator here: the engine orders the calls (save on every
// rank, barrier, manifest on rank 0).
//
// A checkpoint is a directory, best one per save (ckpt/step-000200):
//   rank-<r>-of-<w>.shardfit  one per rank, written by that rank
//   manifest.json             written by rank 0 once every rank has saved:
//                             the commit point. A directory without it is an
//                             unfinished checkpoint and does not load.
//
// Rank file byte layout (integers little-endian; raw tensor bytes are in
// host order, and the build refuses big-endian hosts):
//   [0, 8)          magic "SHRDFIT1" (format version 1)
//   [8, 16)         uint64 N, the header length, a multiple of 8
//   [16, 16 + N)    JSON header (UTF-8), right-padded with spaces:
//                   {"format": "shardfit.rank/1", "rank", "world_size",
//                    "metadata": {...},                  RankState::metadata
//                    "units": [{"unit", "param_tensor", "shard_group_size",
//                               "shard_index", "numel", "padded_numel",
//                               "shard_numel",
//                               "params": [{"name", "shape", "numel",
//                                           "offset"}]}],
//                    "tensors": {"<name>": {"dtype": "F32", "shape": [...],
//                                           "data_offsets": [begin, end]}},
//                    "data_bytes": D}
//   [16 + N, +D)    data: each tensor's bytes, row-major, at its
//                   data_offsets relative to the start of this section;
//                   the tensors tile it with no gap. File length is exactly
//                   16 + N + D.
// Dtype names are safetensors' (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL).
//
// manifest.json: {"format": "shardfit.checkpoint/1", "world_size",
//   "ranks": [{"file", "bytes", "header_fnv1a64"}], "metadata" (rank 0's),
//   "units": [{"unit", "shard_group_size", "numel", "padded_numel",
//              "params": [...]}]}
// The per-rank byte count and header hash catch a rank file rewritten after
// the commit (a later save into the same directory that crashed midway).
//
// Crash safety: every file is written to `<name>.tmp.<pid>`, fsynced, renamed
// over `<name>`, and the directory fsynced; a crash or a failed write never
// leaves a partial file under the final name (only a stray .tmp, which
// loading ignores).
//
// Errors: problems with a checkpoint's content (truncated, corrupt, wrong
// world size, a tensor the job does not expect) throw std::invalid_argument,
// one line that starts with the file's path; a failed write (disk full, no
// permission) throws std::runtime_error naming the path and the OS error.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/checkpoint_layout.h"

namespace shardfit::executor {

// What one rank saves and gets back.
struct RankState {
  // Names are the caller's ("unit3.param_shard", "unit3.exp_avg", ...).
  // Saved from any device and layout; loaded as contiguous CPU tensors.
  std::map<std::string, torch::Tensor> tensors;
  // Scalars: step count, loss-scaler state, RNG seed and offset, data
  // position. A JSON object; integers (int64 and uint64) and doubles round
  // trip exactly.
  nlohmann::json metadata = nlohmann::json::object();
  // One entry per unit this rank holds a shard of.
  std::vector<UnitShardLayout> units;
};

// Writes rank's file into `dir` (created if needed). Throws
// std::invalid_argument when the state is inconsistent (a unit whose
// param_tensor is missing or has the wrong shape, a layout that does not
// follow the padding rule, an unsupported dtype), std::runtime_error when
// the write fails; the previous file under the final name is then intact.
void save_rank_checkpoint(const std::filesystem::path& dir, int rank, int world_size,
                          const RankState& state);

// Rank 0, after every rank's save_rank_checkpoint returned (a barrier):
// checks every rank file and writes manifest.json, committing the
// checkpoint. Throws std::invalid_argument naming a missing or bad rank file.
void write_checkpoint_manifest(const std::filesystem::path& dir, int world_size);

// A committed checkpoint's world size and rank 0's metadata, from its
// manifest alone (no rank file is opened): what a launcher checks before
// starting ranks. Throws std::invalid_argument naming the path when the
// directory holds no committed checkpoint.
struct CheckpointInfo {
  int world_size = 0;
  nlohmann::json metadata;
  // The manifest's units: [{"unit", "shard_group_size", "numel",
  // "padded_numel", "params"}], in the order the ranks saved them.
  nlohmann::json units;
};
CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir);

// Reads rank's file of a committed checkpoint, allocating its tensors.
// Validates the world size ("checkpoint was written by 4 ranks, this job has
// 2"), the header, dtypes, shapes, offsets, the layout and the file length.
RankState load_rank_checkpoint(const std::filesystem::path& dir, int rank, int world_size);

// The same, but reads the tensors straight into the job's own (the engine's
// flat buffers keep their storage; no second copy is allocated when they are
// contiguous CPU tensors). The file must hold exactly the names of `into`,
// each with the same dtype and shape, or std::invalid_argument names the file
// and the first tensor that differs. The returned state's tensors are `into`.
RankState load_rank_checkpoint_into(const std::filesystem::path& dir, int rank, int world_size,
                                    const std::map<std::string, torch::Tensor>& into);

// Consolidates a committed checkpoint into one safetensors file with Hugging
// Face names and shapes: each unit's flat parameter is reassembled from its
// shards (padding dropped) and cut into its parameters by the layout.
// Streams shard by shard: memory is one shard, not the model. Tensors are
// written in name order with the shards' dtype (fp32 master weights).
void export_safetensors(const std::filesystem::path& checkpoint_dir,
                        const std::filesystem::path& out_path);

// safetensors format: uint64 little-endian N, N bytes of JSON
// {"<name>": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"format": "pt"}} padded with spaces to a multiple of 8,
// then the data, which the tensors tile exactly.
void write_safetensors(const std::filesystem::path& path,
                       const std::map<std::string, torch::Tensor>& tensors);
// Validates the header (JSON, dtypes, shapes, offsets tiling the data, file
// length); std::invalid_argument naming the file otherwise.
std::map<std::string, torch::Tensor> read_safetensors(const std::filesystem::path& path);

// Test hook (a fault-injecting environment in one knob): the next file this
// layer writes fails as a full disk would (ENOSPC) once `bytes` bytes have
// reached its temporary file. Fires once; a negative value disarms it.
void inject_write_failure_for_testing(int64_t bytes);

}  // namespace shardfit::executor
