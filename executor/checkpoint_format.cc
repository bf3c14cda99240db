#include "executor/checkpoint_format.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

namespace shardfit::executor::ckpt {

// ----------------------------------------------------------- unit layouts

json unit_to_json(const UnitShardLayout& u, bool with_shard) {
  json params = json::array();
  for (const spec::FlatParamEntry& p : u.params)
    params.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"numel", p.numel}, {"offset", p.offset}});
  json j = {{"unit", u.unit},
            {"shard_group_size", u.shard_group_size},
            {"numel", u.numel},
            {"padded_numel", u.padded_numel},
            {"shard_numel", u.shard_numel},
            {"params", std::move(params)}};
  if (with_shard) {
    j["param_tensor"] = u.param_tensor;
    j["shard_index"] = u.shard_index;
  }
  return j;
}

UnitShardLayout unit_from_json(const fs::path& file, const json& j, const std::string& where) {
  UnitShardLayout u;
  u.unit = string_field(file, j, "unit", where);
  u.param_tensor = string_field(file, j, "param_tensor", where);
  const int64_t group = int_field(file, j, "shard_group_size", where, 1);
  if (group > INT32_MAX)
    bad(file, where + ".shard_group_size " + std::to_string(group) + " is too large");
  u.shard_group_size = static_cast<int>(group);
  u.shard_index =
      static_cast<int>(std::min<int64_t>(int_field(file, j, "shard_index", where), INT32_MAX));
  u.numel = int_field(file, j, "numel", where);
  u.padded_numel = int_field(file, j, "padded_numel", where);
  u.shard_numel = int_field(file, j, "shard_numel", where);
  const json& params = field(file, j, "params", where);
  if (!params.is_array()) bad(file, where + ".params is not an array");
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string pw = where + ".params[" + std::to_string(i) + "]";
    spec::FlatParamEntry p;
    p.name = string_field(file, params[i], "name", pw);
    p.shape = shape_field(file, params[i], "shape", pw);
    p.numel = int_field(file, params[i], "numel", pw);
    p.offset = int_field(file, params[i], "offset", pw);
    u.params.push_back(std::move(p));
  }
  return u;
}

void check_units(const fs::path& file, int world_size, const std::vector<UnitShardLayout>& units,
                 const std::map<std::string, TensorSig>& tensors) {
  std::set<std::string> unit_names, param_names;
  for (const UnitShardLayout& u : units) {
    const std::string where = "unit '" + u.unit + "'";
    if (!unit_names.insert(u.unit).second) bad(file, where + " appears twice");
    if (u.shard_group_size < 1 || u.shard_index < 0 || u.shard_index >= u.shard_group_size) {
      bad(file, where + " holds shard " + std::to_string(u.shard_index) + " of " +
                    std::to_string(u.shard_group_size));
    }
    if (u.shard_group_size > world_size) {
      bad(file, where + " is cut over " + std::to_string(u.shard_group_size) +
                    " ranks, the job has " + std::to_string(world_size));
    }
    std::vector<spec::ParamInfo> infos;
    for (const spec::FlatParamEntry& p : u.params) {
      if (p.name.empty()) bad(file, where + " has a parameter with an empty name");
      if (!param_names.insert(p.name).second) bad(file, "parameter '" + p.name + "' appears twice");
      if (checked_numel(p.shape) != p.numel) {
        bad(file, where + " parameter '" + p.name + "' has numel " + std::to_string(p.numel) +
                      " but shape " + shape_string(p.shape));
      }
      infos.push_back(spec::ParamInfo{p.name, p.shape, p.numel});
    }
    const spec::FlatParamLayout layout(infos, u.shard_group_size);
    for (size_t i = 0; i < u.params.size(); ++i) {
      if (u.params[i].offset != layout.params()[i].offset) {
        bad(file, where + " parameter '" + u.params[i].name + "' is at flat offset " +
                      std::to_string(u.params[i].offset) + ", packing puts it at " +
                      std::to_string(layout.params()[i].offset));
      }
    }
    if (u.numel != layout.numel() || u.padded_numel != layout.padded_numel() ||
        u.shard_numel != layout.shard_numel()) {
      bad(file, where + " says numel " + std::to_string(u.numel) + ", padded " +
                    std::to_string(u.padded_numel) + ", shard " + std::to_string(u.shard_numel) +
                    "; its parameters give " + std::to_string(layout.numel()) + " elements over " +
                    std::to_string(u.shard_group_size) + " ranks: padded " +
                    std::to_string(layout.padded_numel()) + ", " +
                    std::to_string(layout.shard_numel()) + " per rank");
    }
    auto t = tensors.find(u.param_tensor);
    if (t == tensors.end())
      bad(file, where + " names param_tensor '" + u.param_tensor + "', which is not saved");
    const std::vector<int64_t> want = {u.shard_numel};
    if (t->second.shape != want || !t->second.dtype->floating) {
      bad(file, where + " param_tensor '" + u.param_tensor + "' is " + t->second.dtype->name + " " +
                    shape_string(t->second.shape) + ", expected a floating " + shape_string(want));
    }
  }
}

// ------------------------------------------------------------- rank files

const TensorEntry& RankFile::tensor(const std::string& name) const {
  for (const TensorEntry& e : tensors)
    if (e.name == name) return e;
  bad(file.path(), "has no tensor '" + name + "'");
}

RankFile read_rank_header(const fs::path& path, int rank, int world_size) {
  RankFile rf(path);
  const ReadFile& f = rf.file;
  if (f.size() < kRankPreambleBytes) {
    bad(path, "file is " + std::to_string(f.size()) + " bytes, shorter than the " +
                  std::to_string(kRankPreambleBytes) + "-byte preamble (truncated?)");
  }
  unsigned char pre[kRankPreambleBytes];
  f.read_at(0, pre, kRankPreambleBytes);
  if (std::memcmp(pre, kRankMagic, sizeof kRankMagic) != 0)
    bad(path, "not a shardfit rank file (bad magic; expected \"SHRDFIT1\")");
  const uint64_t n = get_u64_le(pre + 8);
  if (n > kMaxHeaderBytes || n > static_cast<uint64_t>(f.size() - kRankPreambleBytes) ||
      n % 8 != 0) {
    bad(path, "header length " + std::to_string(n) + " does not fit the " +
                  std::to_string(f.size()) +
                  "-byte file or is not a multiple of 8 (truncated or corrupt)");
  }
  std::string text(n, '\0');
  f.read_at(kRankPreambleBytes, text.data(), static_cast<int64_t>(n));
  rf.header_hash = hex64(fnv1a64(text));
  const json h = parse_json(path, text, "header");
  if (!h.is_object()) bad(path, "header is not a JSON object");
  const std::string format = string_field(path, h, "format", "header");
  if (format != kRankFormat) bad(path, "format '" + format + "' is not " + kRankFormat);
  const int64_t file_world = int_field(path, h, "world_size", "header", 1);
  const int64_t file_rank = int_field(path, h, "rank", "header");
  if (rank < 0) {  // take the file's word for it, within bounds
    if (file_world > INT32_MAX || file_rank >= file_world) {
      bad(path, "holds rank " + std::to_string(file_rank) + " of world size " +
                    std::to_string(file_world) + ", which is not a rank");
    }
    rank = static_cast<int>(file_rank);
    world_size = static_cast<int>(file_world);
  }
  if (file_world != world_size) {
    bad(path, "checkpoint was written by " + std::to_string(file_world) + " ranks, this job has " +
                  std::to_string(world_size));
  }
  if (file_rank != rank)
    bad(path, "holds rank " + std::to_string(file_rank) + ", expected " + std::to_string(rank));
  rf.rank = rank;
  rf.world_size = world_size;
  const int64_t data_bytes = int_field(path, h, "data_bytes", "header");
  rf.data_start = kRankPreambleBytes + static_cast<int64_t>(n);
  if (f.size() - rf.data_start != data_bytes) {
    bad(path, "file is " + std::to_string(f.size()) + " bytes, its header says " +
                  std::to_string(kRankPreambleBytes) + " + " + std::to_string(n) + " + " +
                  std::to_string(data_bytes) + " = " + std::to_string(rf.data_start + data_bytes) +
                  (f.size() < rf.data_start + data_bytes ? " (truncated)" : " (trailing bytes)"));
  }
  rf.tensors = parse_tensor_table(path, field(path, h, "tensors", "header"), data_bytes, "");
  for (const TensorEntry& e : rf.tensors) {
    if (e.checksum.empty())
      bad(path,
          "tensor '" + e.name + "' has no data checksum (xxh3): not written by this shardfit");
  }
  rf.metadata = field(path, h, "metadata", "header");
  if (!rf.metadata.is_object()) bad(path, "header.metadata is not a JSON object");
  const json& units = field(path, h, "units", "header");
  if (!units.is_array()) bad(path, "header.units is not an array");
  for (size_t i = 0; i < units.size(); ++i)
    rf.units.push_back(unit_from_json(path, units[i], "header.units[" + std::to_string(i) + "]"));
  std::map<std::string, TensorSig> sigs;
  for (const TensorEntry& e : rf.tensors) sigs[e.name] = TensorSig{e.dtype, e.shape};
  check_units(path, world_size, rf.units, sigs);
  return rf;
}

int64_t verify_rank_data(const RankFile& rf) {
  int64_t bytes = 0;
  for (const TensorEntry& e : rf.tensors) {
    verify_tensor_data(rf.file, rf.data_start, e, e.checksum);
    bytes += e.bytes();
  }
  return bytes;
}

// ---------------------------------------------------------------- manifest

Manifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    bad(path,
        "missing, so the checkpoint was never committed (rank 0 writes it once every rank has "
        "saved)");
  }
  const ReadFile f(path);
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_at(0, text.data(), f.size());
  const json m = parse_json(path, text, "manifest");
  if (!m.is_object()) bad(path, "manifest is not a JSON object");
  const std::string format = string_field(path, m, "format", "manifest");
  if (format != kManifestFormat) bad(path, "format '" + format + "' is not " + kManifestFormat);
  // Every field is one write_checkpoint_manifest writes, and each is checked
  // below against the rank files: a field added by hand is an edit, not a
  // newer shardfit's (that would change the format).
  for (auto it = m.begin(); it != m.end(); ++it) {
    static const std::set<std::string> kFields = {"format", "world_size", "ranks", "metadata", "units"};
    if (!kFields.count(it.key())) bad(path, "manifest has a field '" + it.key() + "' that shardfit does not write: edited");
  }
  for (const char* key : {"metadata", "units"}) {
    if (!m.contains(key))
      bad(path, std::string("manifest has no '") + key +
                    "': every shardfit manifest states rank 0's job and layout, so this one was edited or cut");
  }
  Manifest out;
  const int64_t world = int_field(path, m, "world_size", "manifest", 1);
  if (world > INT32_MAX) bad(path, "world_size " + std::to_string(world) + " is too large");
  out.world_size = static_cast<int>(world);
  const json& ranks = field(path, m, "ranks", "manifest");
  if (!ranks.is_array() || static_cast<int64_t>(ranks.size()) != world) {
    bad(path, "manifest.ranks does not list " + std::to_string(world) + " rank files");
  }
  for (int r = 0; r < out.world_size; ++r) {
    const std::string where = "manifest.ranks[" + std::to_string(r) + "]";
    ManifestRank e;
    e.file = string_field(path, ranks[r], "file", where);
    e.bytes = int_field(path, ranks[r], "bytes", where);
    if (ranks[r].is_object() && !ranks[r].contains("header_fnv1a64"))
      bad(path, where + " has no header_fnv1a64: nothing pins the file it lists, so neither verify nor resume "
                        "can trust it (every shardfit manifest has one; edited?)");
    e.header_hash = string_field(path, ranks[r], "header_fnv1a64", where);
    if (ranks[r].size() != 3) bad(path, where + " has fields that shardfit does not write (file, bytes, header_fnv1a64): edited");
    if (e.file != rank_file_name(r, out.world_size)) bad(path, where + ".file is '" + e.file + "'");
    out.ranks.push_back(std::move(e));
  }
  // The job and layout the manifest states are copies of rank 0's header,
  // whose bytes the manifest's header_fnv1a64 pins: a manifest whose step,
  // learning rate, shapes or optimizer-state list were edited disagrees
  // with the file it names, and is refused here, for verify and resume alike.
  const fs::path rank0 = dir / out.ranks[0].file;
  if (!fs::exists(rank0, ec)) bad(rank0, "missing: the manifest lists it");
  const RankFile rf = read_rank_header(rank0, 0, out.world_size);
  if (rf.header_hash != out.ranks[0].header_hash)
    bad(rank0, "is not the file manifest.json committed (header " + rf.header_hash + "; manifest says header " +
                   out.ranks[0].header_hash + ")");
  if (m["metadata"] != rf.metadata)
    bad(path, "manifest.metadata differs from " + out.ranks[0].file + "'s header: edited or damaged");
  json units = json::array();
  for (const UnitShardLayout& u : rf.units) units.push_back(unit_to_json(u, /*with_shard=*/false));
  if (m["units"] != units)
    bad(path, "manifest.units differs from " + out.ranks[0].file + "'s header: edited or damaged");
  return out;
}

Manifest read_manifest_for(const fs::path& dir, int world_size) {
  Manifest m = read_manifest(dir);
  if (m.world_size != world_size) {
    bad(dir / kManifestName, "checkpoint was written by " + std::to_string(m.world_size) +
                                 " ranks, this job has " + std::to_string(world_size));
  }
  return m;
}

// A committed rank file: its header checked, and the file the one the
// manifest recorded.
RankFile open_committed_rank(const fs::path& dir, const Manifest& m, int rank) {
  RankFile rf = read_rank_header(dir / rank_file_name(rank, m.world_size), rank, m.world_size);
  const ManifestRank& want = m.ranks[rank];
  if (rf.file.size() != want.bytes || rf.header_hash != want.header_hash) {
    bad(rf.file.path(), "is not the file manifest.json committed (" +
                            std::to_string(rf.file.size()) + " bytes, header " + rf.header_hash +
                            "; manifest says " + std::to_string(want.bytes) + " bytes, header " +
                            want.header_hash +
                            "): corrupted, or rewritten by a later save that did not finish?");
  }
  return rf;
}

void check_rank_args(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " of world size " +
                                std::to_string(world_size) + " is not a rank");
  }
}

// ------------------------------------------------------------- safetensors

SafetensorsHeader read_safetensors_header(const ReadFile& f) {
  const fs::path& path = f.path();
  if (f.size() < 8)
    bad(path, "file is " + std::to_string(f.size()) + " bytes, too short for a safetensors header");
  unsigned char pre[8];
  f.read_at(0, pre, 8);
  const uint64_t n = get_u64_le(pre);
  if (n > kMaxHeaderBytes || n > static_cast<uint64_t>(f.size() - 8)) {
    bad(path, "header length " + std::to_string(n) + " does not fit the " +
                  std::to_string(f.size()) + "-byte file (truncated or not safetensors)");
  }
  std::string text(n, '\0');
  f.read_at(8, text.data(), static_cast<int64_t>(n));
  const json h = parse_json(path, text, "header");
  if (!h.is_object()) bad(path, "header is not a JSON object");
  SafetensorsHeader out;
  if (auto meta = h.find("__metadata__"); meta != h.end()) {
    if (!meta->is_object()) bad(path, "__metadata__ is not a JSON object");
    for (auto it = meta->begin(); it != meta->end(); ++it) {
      if (!it.value().is_string()) bad(path, "__metadata__ values must be strings");
      out.metadata[it.key()] = it.value().get<std::string>();
    }
  }
  out.data_start = 8 + static_cast<int64_t>(n);
  out.tensors = parse_tensor_table(path, h, f.size() - out.data_start, "__metadata__");
  const std::string prefix = kSafetensorsChecksumPrefix;
  size_t sums = 0;
  for (const auto& [key, value] : out.metadata) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string name = key.substr(prefix.size());
    auto it = std::find_if(out.tensors.begin(), out.tensors.end(),
                           [&](const TensorEntry& e) { return e.name == name; });
    if (it == out.tensors.end())
      bad(path, "__metadata__ has a checksum for tensor '" + name + "', which the file lacks");
    if (!is_checksum(value))
      bad(path, "__metadata__ " + key + " is '" + value + "', not 16 lowercase hex digits");
    it->checksum = value;
    ++sums;
  }
  if (sums != 0 && sums != out.tensors.size()) {
    for (const TensorEntry& e : out.tensors)
      if (e.checksum.empty()) bad(path, "tensor '" + e.name + "' has no checksum in __metadata__");
  }
  out.has_checksums = sums != 0 && sums == out.tensors.size();
  return out;
}

// ------------------------------------------------------------ shardfit verify

VerifySummary verify_path(const fs::path& path) {
  std::error_code ec;
  VerifySummary s;
  if (fs::is_directory(path, ec)) {
    s.what = "checkpoint";
    const Manifest m = read_manifest(path);
    for (int r = 0; r < m.world_size; ++r) {
      const RankFile rf = open_committed_rank(path, m, r);
      s.bytes += verify_rank_data(rf);
      s.tensors += static_cast<int64_t>(rf.tensors.size());
      ++s.files;
    }
    return s;
  }
  const ReadFile f(path);
  char magic[sizeof kRankMagic] = {};
  if (f.size() >= static_cast<int64_t>(sizeof magic)) f.read_at(0, magic, sizeof magic);
  s.files = 1;
  if (std::memcmp(magic, kRankMagic, sizeof magic) == 0) {
    s.what = "rank file";
    const RankFile rf = read_rank_header(path, -1, 0);
    s.bytes = verify_rank_data(rf);
    s.tensors = static_cast<int64_t>(rf.tensors.size());
    return s;
  }
  s.what = "safetensors file";
  const SafetensorsHeader h = read_safetensors_header(f);
  if (!h.has_checksums && !h.tensors.empty())
    bad(path, "carries no shardfit checksums (__metadata__ " +
                  std::string(kSafetensorsChecksumPrefix) +
                  "<tensor>): nothing to verify it against");
  for (const TensorEntry& e : h.tensors) {
    verify_tensor_data(f, h.data_start, e, e.checksum);
    s.bytes += e.bytes();
  }
  s.tensors = static_cast<int64_t>(h.tensors.size());
  return s;
}

}  // namespace shardfit::executor::ckpt

namespace shardfit::executor {

UnitShardLayout UnitShardLayout::from(std::string unit, std::string param_tensor,
                                      const spec::FlatParamLayout& layout, int shard_index) {
  UnitShardLayout u;
  u.unit = std::move(unit);
  u.param_tensor = std::move(param_tensor);
  u.shard_group_size = layout.world();
  u.shard_index = shard_index;
  u.params = layout.params();
  u.numel = layout.numel();
  u.padded_numel = layout.padded_numel();
  u.shard_numel = layout.shard_numel();
  return u;
}

spec::FlatParamLayout UnitShardLayout::flat_layout() const {
  std::vector<spec::ParamInfo> infos;
  for (const spec::FlatParamEntry& p : params)
    infos.push_back(spec::ParamInfo{p.name, p.shape, p.numel});
  return spec::FlatParamLayout(infos, shard_group_size);
}

bool UnitShardLayout::operator==(const UnitShardLayout& o) const {
  if (unit != o.unit || param_tensor != o.param_tensor || shard_group_size != o.shard_group_size ||
      shard_index != o.shard_index || numel != o.numel || padded_numel != o.padded_numel ||
      shard_numel != o.shard_numel || params.size() != o.params.size()) {
    return false;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& a = params[i];
    const auto& b = o.params[i];
    if (a.name != b.name || a.shape != b.shape || a.numel != b.numel || a.offset != b.offset)
      return false;
  }
  return true;
}

std::string rank_file_name(int rank, int world_size) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".shardfit";
}

}  // namespace shardfit::executor
