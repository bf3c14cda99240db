#include "executor/hf_init.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "executor/checkpoint_format.h"
#include "executor/checkpoint_io.h"
#include "executor/tracking_allocator.h"
#include "models/model.h"

namespace shardfit::executor {
namespace {

namespace fs = std::filesystem;

// A tensor of a safetensors file (huggingface/safetensors, README "Format":
// an 8-byte little-endian header length N, N bytes of JSON {name: {dtype,
// shape, data_offsets}}, then the data), with absolute file offsets.
struct StoredTensor {
  fs::path file;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // absolute file offsets
};

[[noreturn]] void bad(const fs::path& p, const std::string& what) {
  throw std::invalid_argument(p.string() + ": " + what);
}

// The header read by the one safetensors parser (checkpoint_format.cc's,
// which tests/fuzz feeds): offsets tiling the data section, dtypes known.
std::map<std::string, StoredTensor> read_header(const fs::path& file) {
  const ckpt::ReadFile f(file);
  const ckpt::SafetensorsHeader h = ckpt::read_safetensors_header(f);
  std::map<std::string, StoredTensor> out;
  for (const ckpt::TensorEntry& e : h.tensors)
    out.emplace(e.name, StoredTensor{file, e.dtype->name, e.shape, h.data_start + e.begin, h.data_start + e.end});
  return out;
}

// Every stored tensor of the checkpoint at `path`, by name.
std::map<std::string, StoredTensor> read_checkpoint(const fs::path& path) {
  if (!fs::is_directory(path)) return read_header(path);
  const fs::path index = path / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    if (fs::exists(path / "model.safetensors")) return read_header(path / "model.safetensors");
    bad(path, "no model.safetensors or model.safetensors.index.json in the directory");
  }
  std::ifstream in(index);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    bad(index, "needs a JSON object with a weight_map");
  std::map<std::string, std::map<std::string, StoredTensor>> shards;
  std::map<std::string, StoredTensor> out;
  for (const auto& item : j["weight_map"].items()) {
    if (!item.value().is_string())
      bad(index, "weight_map['" + item.key() + "'] must be a file name");
    const std::string shard = item.value().get<std::string>();
    if (shard.find('/') != std::string::npos)
      bad(index, "shard file '" + shard + "' must be in the same directory");
    auto it = shards.find(shard);
    if (it == shards.end()) it = shards.emplace(shard, read_header(path / shard)).first;
    auto t = it->second.find(item.key());
    if (t == it->second.end())
      bad(path / shard, "tensor '" + item.key() + "' is in the index but not in the shard");
    out.emplace(item.key(), t->second);
  }
  for (const auto& [shard, tensors] : shards)
    for (const auto& [name, t] : tensors)
      if (!out.count(name))
        bad(path / shard, "tensor '" + name + "' is not in the index's weight_map");
  return out;
}

c10::ScalarType scalar_type_of(const std::string& dtype, int64_t* elem) {
  if (dtype == "F32") return *elem = 4, c10::ScalarType::Float;
  if (dtype == "BF16") return *elem = 2, c10::ScalarType::BFloat16;
  if (dtype == "F16") return *elem = 2, c10::ScalarType::Half;
  return *elem = 0, c10::ScalarType::Undefined;
}

// Model parameter name -> stored tensor, checked.
std::map<std::string, const StoredTensor*> match(const fs::path& path,
                                                 const std::map<std::string, StoredTensor>& stored,
                                                 torch::nn::Module& model) {
  std::map<std::string, const StoredTensor*> out;
  std::set<std::string> used;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    std::string key = p.key();
    auto it = stored.find(key);
    // transformers' base_model_prefix: a GPT-2 saved as GPT2Model has no "transformer.".
    const std::string prefix = "transformer.";
    if (it == stored.end() && key.rfind(prefix, 0) == 0) {
      key = key.substr(prefix.size());
      it = stored.find(key);
    }
    if (it == stored.end()) bad(path, "tensor '" + p.key() + "' is missing");
    const StoredTensor& t = it->second;
    int64_t elem = 0;
    scalar_type_of(t.dtype, &elem);
    if (elem == 0)
      bad(t.file, "tensor '" + key + "' has dtype " + t.dtype + " (F32, BF16 or F16 expected)");
    if (t.shape != p.value().sizes().vec()) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      bad(t.file, "tensor '" + key + "' has shape " + str(t.shape) + ", the model's is " +
                      str(p.value().sizes().vec()));
    }
    if (t.end - t.begin != p.value().numel() * elem)
      bad(t.file, "tensor '" + key + "' holds " + std::to_string(t.end - t.begin) +
                      " bytes, its shape needs " + std::to_string(p.value().numel() * elem));
    used.insert(key);
    out.emplace(p.key(), &t);
  }
  for (const auto& [name, t] : stored)
    if (!used.count(name))
      bad(t.file, "tensor '" + name + "' is not a parameter of the model (extra name)");
  return out;
}

}  // namespace

std::vector<std::string> check_hf_checkpoint(const std::string& path, torch::nn::Module& model, bool verify_data) {
  const auto stored = read_checkpoint(path);
  match(path, stored, model);
  std::vector<std::string> unchecksummed;
  if (!verify_data) return unchecksummed;
  std::set<fs::path> files;
  for (const auto& [name, t] : stored) files.insert(t.file);
  for (const fs::path& file : files) {
    const ckpt::ReadFile f(file);
    const ckpt::SafetensorsHeader h = ckpt::read_safetensors_header(f);
    for (const ckpt::TensorEntry& e : h.tensors) {
      if (h.has_checksums)
        ckpt::verify_tensor_data(f, h.data_start, e, e.checksum);
      else
        ckpt::verify_tensor_finite(f, h.data_start, e);
    }
    if (!h.has_checksums) unchecksummed.push_back(file.string());
  }
  return unchecksummed;
}

std::vector<std::string> check_hf_checkpoint(const std::string& path, const models::ModelConfig& config,
                                             bool verify_data) {
  auto meta = models::build_model(config, torch::TensorOptions().device(torch::kMeta));
  return check_hf_checkpoint(path, *meta, verify_data);
}

struct HfCheckpoint::Impl {
  std::map<std::string, StoredTensor> stored;
  std::map<std::string, const StoredTensor*> matched;  // model name -> stored
  std::map<fs::path, ckpt::ReadFile> files;
};

HfCheckpoint::HfCheckpoint(const std::string& path, torch::nn::Module& model)
    : impl_(std::make_unique<Impl>()) {
  impl_->stored = read_checkpoint(path);
  impl_->matched = match(path, impl_->stored, model);
  for (const auto& [name, t] : impl_->matched) data_bytes_ += t->end - t->begin;
}

HfCheckpoint::~HfCheckpoint() = default;

void HfCheckpoint::read(const std::string& name, int64_t offset, const torch::Tensor& dst) {
  auto it = impl_->matched.find(name);
  if (it == impl_->matched.end()) throw std::logic_error("--init: no stored tensor for parameter " + name);
  const StoredTensor& t = *it->second;
  int64_t elem = 0;
  const auto dtype = scalar_type_of(t.dtype, &elem);
  const int64_t n = dst.numel();
  if (offset < 0 || offset + n > (t.end - t.begin) / elem || !dst.is_contiguous())
    throw std::logic_error("--init: elements [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") of " + name + " asked for");
  auto file = impl_->files.find(t.file);
  if (file == impl_->files.end()) file = impl_->files.emplace(t.file, ckpt::ReadFile(t.file)).first;
  torch::NoGradGuard no_grad;
  // The stored bytes of this piece, on the host (not the emulated device),
  // converted on the host, then copied into place.
  ScopedUntracked host;
  torch::Tensor buf = torch::empty({n}, torch::TensorOptions().dtype(dtype));
  file->second.read_at(t.begin + offset * elem, buf.data_ptr(), n * elem);
  bytes_read_ += n * elem;
  if (dst.device().is_cpu()) {
    dst.copy_(buf);  // converts in place: no fp32 temporary
  } else {
    dst.copy_(buf.to(dst.scalar_type()));
  }
}

}  // namespace shardfit::executor
