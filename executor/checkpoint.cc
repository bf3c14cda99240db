#include "executor/checkpoint.h"

#include <algorithm>
#include <stdexcept>

#include "executor/checkpoint_format.h"
#include "executor/checkpoint_torch.h"

namespace shardfit::executor {

// Tensor bytes go to disk as they sit in memory; the format says
// little-endian, so a big-endian host would need byte swaps nobody tests.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint format is little-endian");

using namespace ckpt;  // NOLINT: this file is the checkpoint layer's LibTorch half

namespace {

// Reads e into dst and checks the bytes against the header's checksum.
void read_tensor_data(const RankFile& rf, const TensorEntry& e, const torch::Tensor& dst) {
  if (dst.is_contiguous() && dst.device().is_cpu()) {
    rf.file.read_at(rf.data_start + e.begin, dst.data_ptr(), e.bytes());
    check_checksum(rf.file.path(), e, e.checksum, dst.data_ptr());
    return;
  }
  torch::Tensor tmp = torch::empty(e.shape, torch::TensorOptions().dtype(scalar_type(e.dtype)));
  rf.file.read_at(rf.data_start + e.begin, tmp.data_ptr(), e.bytes());
  check_checksum(rf.file.path(), e, e.checksum, tmp.data_ptr());
  torch::NoGradGuard no_grad;
  dst.copy_(tmp);
}

RankState load_rank(const fs::path& dir, int rank, int world_size,
                    const std::map<std::string, torch::Tensor>* into) {
  check_rank_args(rank, world_size);
  const Manifest m = read_manifest_for(dir, world_size);
  const RankFile rf = open_committed_rank(dir, m, rank);
  RankState state;
  state.metadata = rf.metadata;
  state.units = rf.units;
  if (!into) {
    for (const TensorEntry& e : rf.tensors) {
      torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(scalar_type(e.dtype)));
      read_tensor_data(rf, e, t);
      state.tensors.emplace(e.name, std::move(t));
    }
    return state;
  }
  // Check every name, dtype and shape before touching the job's tensors.
  for (const auto& [name, dst] : *into) {
    const auto it = std::find_if(rf.tensors.begin(), rf.tensors.end(),
                                 [&](const TensorEntry& e) { return e.name == name; });
    if (it == rf.tensors.end())
      bad(rf.file.path(), "has no tensor '" + name + "', which this job expects");
    const DTypeInfo* want = dtype_of(dst.scalar_type());
    const std::vector<int64_t> want_shape = dst.sizes().vec();
    if (want != it->dtype || want_shape != it->shape) {
      bad(rf.file.path(),
          "tensor '" + name + "' is " + it->dtype->name + " " + shape_string(it->shape) +
              ", this job has " + (want ? want->name : "an unsupported dtype") + " " +
              shape_string(want_shape) + " (a different model, wrap policy or world size?)");
    }
  }
  for (const TensorEntry& e : rf.tensors) {
    if (!into->count(e.name))
      bad(rf.file.path(), "holds tensor '" + e.name + "', which this job does not expect");
  }
  for (const TensorEntry& e : rf.tensors) read_tensor_data(rf, e, into->at(e.name));
  state.tensors = *into;
  return state;
}

}  // namespace

void save_rank_checkpoint(const fs::path& dir, int rank, int world_size, const RankState& state) {
  check_rank_args(rank, world_size);
  const fs::path path = dir / rank_file_name(rank, world_size);
  if (!state.metadata.is_object())
    bad(path, "metadata must be a JSON object, got " + std::string(state.metadata.type_name()));

  std::vector<torch::Tensor> host;  // keeps the contiguous copies alive until written
  std::map<std::string, TensorSig> sigs;
  json table = json::object();
  int64_t data_bytes = 0;
  for (const auto& [name, t] : state.tensors) {  // map order = data order
    if (name.empty()) bad(path, "a tensor has an empty name");
    if (!t.defined()) bad(path, "tensor '" + name + "' is undefined");
    const DTypeInfo* d = dtype_of(t.scalar_type());
    if (!d)
      bad(path, "tensor '" + name + "' has unsupported dtype " +
                    std::string(c10::toString(t.scalar_type())));
    host.push_back(host_contiguous(t));
    const int64_t bytes = t.numel() * d->bytes;
    table[name] = {{"dtype", d->name},
                   {"shape", t.sizes().vec()},
                   {"data_offsets", {data_bytes, data_bytes + bytes}},
                   {"xxh3", xxh3_hex(host.back().data_ptr(), static_cast<size_t>(bytes))}};
    data_bytes += bytes;
    sigs[name] = TensorSig{d, t.sizes().vec()};
  }
  check_units(path, world_size, state.units, sigs);

  json units = json::array();
  for (const UnitShardLayout& u : state.units)
    units.push_back(unit_to_json(u, /*with_shard=*/true));
  const json header = {{"format", kRankFormat},     {"rank", rank},
                       {"world_size", world_size},  {"metadata", state.metadata},
                       {"units", std::move(units)}, {"tensors", std::move(table)},
                       {"data_bytes", data_bytes}};
  std::string text;
  try {
    text = padded_header(header, kRankPreambleBytes);
  } catch (const json::exception& e) {  // e.g. a name that is not UTF-8
    bad(path, std::string("cannot encode the header: ") + e.what());
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(dir.string() + ": cannot create the checkpoint directory (" +
                             ec.message() + ")");
  std::string preamble(kRankMagic, sizeof kRankMagic);
  put_u64_le(&preamble, text.size());
  AtomicFileWriter out(path);
  out.append(preamble.data(), static_cast<int64_t>(preamble.size()));
  out.append(text.data(), static_cast<int64_t>(text.size()));
  for (const torch::Tensor& t : host)
    out.append(t.data_ptr(), t.numel() * static_cast<int64_t>(t.element_size()));
  out.commit();
}

void write_checkpoint_manifest(const fs::path& dir, int world_size) {
  check_rank_args(0, world_size);
  json ranks = json::array();
  json metadata, units = json::array();
  for (int r = 0; r < world_size; ++r) {
    const fs::path path = dir / rank_file_name(r, world_size);
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      bad(path,
          "missing: every rank must finish save_rank_checkpoint before rank 0 writes the manifest");
    }
    const RankFile rf = read_rank_header(path, r, world_size);
    ranks.push_back({{"file", rank_file_name(r, world_size)},
                     {"bytes", rf.file.size()},
                     {"header_fnv1a64", rf.header_hash}});
    if (r == 0) {
      metadata = rf.metadata;
      for (const UnitShardLayout& u : rf.units)
        units.push_back(unit_to_json(u, /*with_shard=*/false));
    }
  }
  const json manifest = {{"format", kManifestFormat},
                         {"world_size", world_size},
                         {"ranks", std::move(ranks)},
                         {"metadata", std::move(metadata)},
                         {"units", std::move(units)}};
  const std::string text = manifest.dump(2) + "\n";
  AtomicFileWriter out(dir / kManifestName);
  out.append(text.data(), static_cast<int64_t>(text.size()));
  out.commit();
}

CheckpointInfo read_checkpoint_info(const fs::path& dir) {
  const Manifest m = read_manifest(dir);
  const fs::path path = dir / kManifestName;
  const ReadFile f(path);
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_at(0, text.data(), f.size());
  CheckpointInfo info;
  info.world_size = m.world_size;
  const json manifest = parse_json(path, text, "manifest");
  info.metadata = field(path, manifest, "metadata", "manifest");
  info.units = field(path, manifest, "units", "manifest");
  return info;
}

RankState load_rank_checkpoint(const fs::path& dir, int rank, int world_size) {
  return load_rank(dir, rank, world_size, nullptr);
}

RankState load_rank_checkpoint_into(const fs::path& dir, int rank, int world_size,
                                    const std::map<std::string, torch::Tensor>& into) {
  return load_rank(dir, rank, world_size, &into);
}

void inject_write_failure_for_testing(int64_t bytes) { set_fail_write_after_bytes(bytes); }

}  // namespace shardfit::executor
