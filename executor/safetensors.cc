#include <algorithm>
#include <stdexcept>

#include "executor/checkpoint.h"
#include "executor/checkpoint_format.h"
#include "executor/checkpoint_torch.h"

// Consolidated Hugging Face safetensors: export from a sharded checkpoint,
// write and read. Each tensor's data checksum (xxh3) goes into
// __metadata__ ("shardfit.xxh3.<name>"), where Hugging Face's loaders keep
// and ignore string entries, so the file stays loadable as it is.
namespace shardfit::executor {

using namespace ckpt;  // NOLINT: the checkpoint layer's LibTorch half

namespace {

struct SafetensorsPlan {
  std::string header;                          // padded JSON
  std::map<std::string, int64_t> data_offset;  // name -> begin within the data section
  int64_t data_bytes = 0;
};

// `checksums`: name -> xxh3 hex; a name missing from it gets a placeholder
// of the same length, patched in later (patch_header).
SafetensorsPlan plan_safetensors(
    const std::map<std::string, std::pair<const DTypeInfo*, std::vector<int64_t>>>& tensors,
    const std::map<std::string, std::string>& checksums) {
  SafetensorsPlan plan;
  json header = json::object();
  json metadata = {{"format", "pt"}};
  for (const auto& [name, sig] : tensors) {
    const int64_t bytes = checked_numel(sig.second) * sig.first->bytes;
    header[name] = {{"dtype", sig.first->name},
                    {"shape", sig.second},
                    {"data_offsets", {plan.data_bytes, plan.data_bytes + bytes}}};
    plan.data_offset[name] = plan.data_bytes;
    plan.data_bytes += bytes;
    auto it = checksums.find(name);
    metadata[kSafetensorsChecksumPrefix + name] =
        it != checksums.end() ? it->second : std::string(16, '0');
  }
  header["__metadata__"] = std::move(metadata);
  plan.header = padded_header(header, 8);
  return plan;
}

}  // namespace

void export_safetensors(const fs::path& checkpoint_dir, const fs::path& out_path) {
  const Manifest m = read_manifest(checkpoint_dir);
  std::vector<RankFile> files;
  for (int r = 0; r < m.world_size; ++r) files.push_back(open_committed_rank(checkpoint_dir, m, r));
  // Every byte exported is checked first: a corrupt shard is an error
  // naming its file and tensor, never a plausible-looking model.
  for (const RankFile& rf : files) verify_rank_data(rf);

  // Each unit once, with the rank file that holds each of its shards. Under
  // hybrid sharding or ddp several ranks hold the same shard; the first wins.
  struct Source {
    const RankFile* file = nullptr;
    const TensorEntry* tensor = nullptr;
  };
  struct UnitSources {
    UnitShardLayout layout;
    const DTypeInfo* dtype = nullptr;
    std::vector<Source> shards;
  };
  std::map<std::string, UnitSources> units;
  std::vector<std::string> unit_order;
  for (const RankFile& rf : files) {
    for (const UnitShardLayout& u : rf.units) {
      const TensorEntry& t = rf.tensor(u.param_tensor);
      auto [it, fresh] = units.try_emplace(u.unit);
      UnitSources& us = it->second;
      if (fresh) {
        us.layout = u;
        us.dtype = t.dtype;
        us.shards.resize(u.shard_group_size);
        unit_order.push_back(u.unit);
      } else {
        UnitShardLayout same = u;
        same.param_tensor = us.layout.param_tensor;
        same.shard_index = us.layout.shard_index;
        if (same != us.layout || t.dtype != us.dtype) {
          bad(rf.file.path(),
              "unit '" + u.unit + "' has a different layout or dtype than in " +
                  us.shards[us.layout.shard_index].file->file.path().filename().string());
        }
      }
      if (!us.shards[u.shard_index].file) us.shards[u.shard_index] = Source{&rf, &t};
    }
  }

  // GPT-2's output embedding is tied: the layout holds transformer.wte.weight
  // only, and transformers re-ties lm_head.weight to it when it loads the
  // file (tie_word_embeddings), so no duplicate lm_head.weight is written.
  std::map<std::string, std::pair<const DTypeInfo*, std::vector<int64_t>>> sigs;
  for (const std::string& name : unit_order) {
    const UnitSources& us = units.at(name);
    for (int s = 0; s < us.layout.shard_group_size; ++s) {
      if (!us.shards[s].file) {
        bad(checkpoint_dir, "no rank file holds shard " + std::to_string(s) + " of unit '" + name +
                                "' (" + std::to_string(us.layout.shard_group_size) + " shards)");
      }
    }
    for (const spec::FlatParamEntry& p : us.layout.params) {
      if (!sigs.emplace(p.name, std::make_pair(us.dtype, p.shape)).second)
        bad(checkpoint_dir, "parameter '" + p.name + "' is held by two units");
    }
  }

  const SafetensorsPlan plan = plan_safetensors(sigs, {});
  const int64_t data_start = 8 + static_cast<int64_t>(plan.header.size());
  // Each parameter's pieces arrive in order (shards ascend, and so do the
  // pieces in each), so its checksum streams along with the copy.
  std::map<std::string, Xxh3Stream> hashes;
  for (const auto& [name, sig] : sigs) hashes.emplace(name, Xxh3Stream());
  std::string preamble;
  put_u64_le(&preamble, plan.header.size());
  AtomicFileWriter out(out_path);
  out.append(preamble.data(), 8);
  out.append(plan.header.data(), static_cast<int64_t>(plan.header.size()));
  // Each shard's pieces go straight to their parameters' places; what the
  // pieces leave uncovered is padding and is never read.
  std::vector<char> buffer;
  int64_t copied = 0;
  for (const std::string& name : unit_order) {
    const UnitSources& us = units.at(name);
    const spec::FlatParamLayout layout = us.layout.flat_layout();
    const int64_t es = us.dtype->bytes;
    for (int s = 0; s < us.layout.shard_group_size; ++s) {
      const Source& src = us.shards[s];
      for (const spec::ShardPiece& piece : layout.pieces(s)) {
        const spec::FlatParamEntry& p = layout.params()[piece.param];
        const int64_t from = src.file->data_start + src.tensor->begin + piece.shard_offset * es;
        const int64_t to = data_start + plan.data_offset.at(p.name) + piece.param_offset * es;
        for (int64_t done = 0, total = piece.numel * es; done < total;) {
          const int64_t n = std::min(kCopyChunkBytes, total - done);
          buffer.resize(static_cast<size_t>(n));
          src.file->file.read_at(from + done, buffer.data(), n);
          hashes.at(p.name).update(buffer.data(), static_cast<size_t>(n));
          out.write_at(to + done, buffer.data(), n);
          done += n;
        }
        copied += piece.numel * es;
      }
    }
  }
  if (copied != plan.data_bytes) {  // the pieces tile every parameter exactly once
    throw std::logic_error("export_safetensors copied " + std::to_string(copied) + " bytes of " +
                           std::to_string(plan.data_bytes));
  }
  std::map<std::string, std::string> checksums;
  for (const auto& [name, h] : hashes) checksums[name] = h.hex();
  const SafetensorsPlan final_plan = plan_safetensors(sigs, checksums);
  if (final_plan.header.size() != plan.header.size())
    throw std::logic_error("export_safetensors: the checksummed header changed length");
  out.write_at(8, final_plan.header.data(), static_cast<int64_t>(final_plan.header.size()));
  out.commit();
}

void write_safetensors(const fs::path& path, const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, std::pair<const DTypeInfo*, std::vector<int64_t>>> sigs;
  for (const auto& [name, t] : tensors) {
    const DTypeInfo* d = t.defined() ? dtype_of(t.scalar_type()) : nullptr;
    if (!d) bad(path, "tensor '" + name + "' is undefined or has an unsupported dtype");
    if (name == "__metadata__" || name.empty()) bad(path, "'" + name + "' is not a tensor name");
    sigs[name] = {d, t.sizes().vec()};
  }
  std::vector<torch::Tensor> host;
  std::map<std::string, std::string> checksums;
  for (const auto& [name, t] : tensors) {  // map order, as planned
    host.push_back(host_contiguous(t));
    checksums[name] = xxh3_hex(host.back().data_ptr(), host.back().nbytes());
  }
  const SafetensorsPlan plan = plan_safetensors(sigs, checksums);
  std::string preamble;
  put_u64_le(&preamble, plan.header.size());
  AtomicFileWriter out(path);
  out.append(preamble.data(), 8);
  out.append(plan.header.data(), static_cast<int64_t>(plan.header.size()));
  for (const torch::Tensor& h : host)
    out.append(h.data_ptr(), h.numel() * static_cast<int64_t>(h.element_size()));
  out.commit();
}

std::map<std::string, torch::Tensor> read_safetensors(const fs::path& path) {
  const ReadFile f(path);
  const SafetensorsHeader h = read_safetensors_header(f);
  std::map<std::string, torch::Tensor> out;
  for (const TensorEntry& e : h.tensors) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(scalar_type(e.dtype)));
    f.read_at(h.data_start + e.begin, t.data_ptr(), e.bytes());
    if (!e.checksum.empty()) check_checksum(path, e, e.checksum, t.data_ptr());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace shardfit::executor
