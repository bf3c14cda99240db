#include "planner/profile.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace shardfit::planner {
namespace {

using nlohmann::json;

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// Reads typed fields out of a profile's JSON, naming the file and the dotted
// field in every error, so a user fixing a profile sees exactly what to edit.
class ProfileReader {
 public:
  ProfileReader(const json& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::invalid_argument("device profile " + origin_ + ": field '" + field + "' " + what);
  }

  // The node at a dotted path, or nullptr when absent.
  const json* find(const std::string& dotted) const {
    const json* node = &root_;
    std::stringstream parts(dotted);
    std::string key;
    while (std::getline(parts, key, '.')) {
      if (!node->is_object()) return nullptr;
      auto it = node->find(key);
      if (it == node->end()) return nullptr;
      node = &*it;
    }
    return node;
  }

  const json& need(const std::string& dotted) const {
    const json* node = find(dotted);
    if (!node) fail(dotted, "is missing");
    return *node;
  }

  std::string text(const std::string& dotted) const {
    const json& node = need(dotted);
    if (!node.is_string()) fail(dotted, "must be a string");
    return node.get<std::string>();
  }

  double number(const std::string& dotted) const {
    const json& node = need(dotted);
    if (!node.is_number()) fail(dotted, "must be a number");
    double value = node.get<double>();
    if (!std::isfinite(value) || value < 0) fail(dotted, "must be a finite number >= 0");
    return value;
  }

  // Absent = 0: used for optional dtypes (no bf16 on Turing).
  double optional_number(const std::string& dotted) const {
    return find(dotted) ? number(dotted) : 0.0;
  }

  int64_t bytes(const std::string& dotted) const {
    const json& node = need(dotted);
    if (!node.is_number_integer() || node.get<int64_t>() < 0)
      fail(dotted, "must be a whole number of bytes >= 0");
    return node.get<int64_t>();
  }

  // A whole number of bytes, or a list of them (each >= 0).
  std::vector<int64_t> bytes_list(const std::string& dotted) const {
    const json& node = need(dotted);
    if (!node.is_array()) return {bytes(dotted)};
    std::vector<int64_t> out;
    for (const json& v : node) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        fail(dotted, "must be a whole number of bytes >= 0, or a list of them");
      out.push_back(v.get<int64_t>());
    }
    return out;
  }

  double fraction(const std::string& dotted) const {
    double value = number(dotted);
    if (value <= 0 || value > 1) fail(dotted, "must be in (0, 1]");
    return value;
  }

 private:
  const json& root_;
  std::string origin_;
};

std::optional<DType> dtype_named(const std::string& key) {
  if (key == "fp32") return DType::kF32;
  if (key == "bf16") return DType::kBF16;
  if (key == "fp16") return DType::kF16;
  return std::nullopt;
}

// Every number in a profile must say where it came from: collects the dotted
// paths of all numeric leaves outside "sources".
void collect_numeric_paths(const json& node, const std::string& prefix,
                           std::vector<std::string>* out) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (prefix.empty() && it.key() == "sources") continue;
      collect_numeric_paths(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
  } else if (node.is_array()) {  // a list of numbers (cublas_workspace) is sourced as one field
    for (const json& v : node) collect_numeric_paths(v, prefix, out);
  } else if (node.is_number()) {
    out->push_back(prefix);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read device profile file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

double DeviceProfile::peak_flops_per_s(DType dtype) const {
  switch (dtype) {
    case DType::kF32:
      return fp32_flops_per_s;
    case DType::kF16:
      return fp16_flops_per_s;
    case DType::kBF16:
      return bf16_flops_per_s;
  }
  return 0;
}

double DeviceProfile::flops_efficiency(DType dtype) const {
  switch (dtype) {
    case DType::kF32:
      return efficiency.flops_fp32;
    case DType::kF16:
      return efficiency.flops_fp16;
    case DType::kBF16:
      return efficiency.flops_bf16;
  }
  return 0;
}

double MeasuredKernels::matmul_rate(DType dtype, const GemmShape& g) const {
  const std::vector<double>& rates = matmul_flops_per_s.at(dtype);
  const size_t n = matmul_dims.size();
  // Where `x` falls on the grid: the cell below and the weight of the one above.
  auto locate = [&](int64_t x) -> std::pair<size_t, double> {
    if (x <= matmul_dims.front() || n == 1) return {0, 0.0};
    if (x >= matmul_dims.back()) return {n - 2, 1.0};
    size_t i = 0;
    while (matmul_dims[i + 1] < x) ++i;
    const double lo = std::log(static_cast<double>(matmul_dims[i]));
    const double hi = std::log(static_cast<double>(matmul_dims[i + 1]));
    return {i, (std::log(static_cast<double>(x)) - lo) / (hi - lo)};
  };
  const auto [im, wm] = locate(g.m);
  const auto [in, wn] = locate(g.n);
  const auto [ik, wk] = locate(g.k);
  double log_rate = 0;
  for (size_t a = 0; a < 2; ++a)
    for (size_t b = 0; b < 2; ++b)
      for (size_t c = 0; c < 2; ++c) {
        const double w = (a ? wm : 1 - wm) * (b ? wn : 1 - wn) * (c ? wk : 1 - wk);
        if (w == 0) continue;
        const size_t at = ((std::min(im + a, n - 1) * n) + std::min(in + b, n - 1)) * n + std::min(ik + c, n - 1);
        log_rate += w * std::log(rates[at]);
      }
  return std::exp(log_rate);
}

int64_t DeviceProfile::allocator_budget_bytes(int64_t device_mem_bytes, int world_size) const {
  if (device_mem_bytes == 0) return 0;  // unlimited stays unlimited
  // NCCL only opens a communicator (and its buffers) with a peer to talk to.
  int64_t nccl_bytes = world_size > 1 ? nccl_buffers_bytes : 0;
  int64_t outside_bytes = cuda_context_bytes + nccl_bytes;
  if (device_mem_bytes <= outside_bytes) {
    throw std::invalid_argument("device memory " + format_size(device_mem_bytes) +
                                " is not above the fixed overheads of " + name + " (" +
                                format_size(outside_bytes) + " = CUDA context " +
                                format_size(cuda_context_bytes) + " + NCCL buffers " +
                                format_size(nccl_bytes) + "); give a larger --gpu-mem");
  }
  return device_mem_bytes - outside_bytes;
}

// A table of measured lines at `field`, {outer: {inner: {fields...}}}, each
// outer key one of `outers` (a `outer_what`), each inner one of `inners` (a
// `inner_what`), each line's three fields numbers >= 0 (ProfileReader::number).
using LineTable = std::map<std::string, std::map<std::string, std::array<double, 3>>>;
LineTable parse_line_table(const ProfileReader& r, const std::string& field, const std::string& outer_what,
                           const std::vector<std::string>& outers, const std::string& inner_what,
                           const std::vector<std::string>& inners, const std::array<const char*, 3>& fields) {
  LineTable table;
  const json* outer = r.find(field);
  if (!outer) return table;
  auto one_of = [](const std::string& key, const std::vector<std::string>& keys) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  auto listed = [](const std::vector<std::string>& keys) {
    std::string text;
    for (const std::string& k : keys) text += (text.empty() ? "" : ", ") + k;
    return text;
  };
  const std::string line = std::string("{") + fields[0] + ", " + fields[1] + ", " + fields[2] + "}";
  if (!outer->is_object()) r.fail(field, "must be an object of " + outer_what + ": {" + inner_what + ": " + line + "}");
  for (auto o = outer->begin(); o != outer->end(); ++o) {
    if (!one_of(o.key(), outers)) r.fail(field + "." + o.key(), "names no " + outer_what + " (" + listed(outers) + ")");
    if (!o->is_object()) r.fail(field + "." + o.key(), "must be an object of " + inner_what + ": line");
    for (auto i = o->begin(); i != o->end(); ++i) {
      const std::string at = field + "." + o.key() + "." + i.key();
      if (!one_of(i.key(), inners)) r.fail(at, "names no " + inner_what + " (" + listed(inners) + ")");
      std::array<double, 3>& values = table[o.key()][i.key()];
      for (int f = 0; f < 3; ++f) values[f] = r.number(at + "." + fields[f]);
    }
  }
  return table;
}

// measured_kernels.adamw_steps: {step: {tensor kind: {fixed_s, per_tensor_s, per_shape_s}}};
// measured_kernels.fsdp1_hooks and .fsdp2_hooks: {zero3|zero2: {forward|backward: {fixed_s, per_group_s,
// per_param_s}}}; measured_kernels.ddp_hooks: {copy|view: {forward|backward: {fixed_s, per_bucket_s,
// per_param_s}}}.
void parse_pytorch_lines(const ProfileReader& r, MeasuredKernels& k) {
  for (const auto& [step, kinds] :
       parse_line_table(r, "measured_kernels.adamw_steps", "AdamW step", {"for-loop", "foreach", "fused"},
                        "tensor kind", {"tensor", "dtensor"}, {"fixed_s", "per_tensor_s", "per_shape_s"}))
    for (const auto& [kind, v] : kinds) k.adamw_steps[step][kind] = {v[0], v[1], v[2]};
  for (int version : {1, 2}) {
    const std::string name = "fsdp" + std::to_string(version);
    for (const auto& [sharding, phases] :
         parse_line_table(r, "measured_kernels." + name + "_hooks", "FSDP sharding", {"zero3", "zero2"}, "phase",
                          {"forward", "backward"}, {"fixed_s", "per_group_s", "per_param_s"}))
      for (const auto& [phase, v] : phases) k.fsdp_hooks[version][sharding][phase] = {v[0], v[1], v[2]};
  }
  for (const auto& [mode, phases] :
       parse_line_table(r, "measured_kernels.ddp_hooks", "DDP gradient mode", {"copy", "view"}, "phase",
                        {"forward", "backward"}, {"fixed_s", "per_bucket_s", "per_param_s"}))
    for (const auto& [phase, v] : phases) k.ddp_hooks[mode][phase] = {v[0], v[1], v[2]};
}

namespace {

// The line at table[outer][inner], or nullptr when either key is not measured.
template <typename Line>
const Line* line_at(const std::map<std::string, std::map<std::string, Line>>& table, const std::string& outer,
                    const std::string& inner) {
  const auto o = table.find(outer);
  if (o == table.end()) return nullptr;
  const auto line = o->second.find(inner);
  return line == o->second.end() ? nullptr : &line->second;
}

}  // namespace

const MeasuredKernels::DispatchLine* MeasuredKernels::adamw_step(const std::string& step,
                                                                 const std::string& tensor_kind) const {
  return line_at(adamw_steps, step, tensor_kind);
}

const MeasuredKernels::HookLine* MeasuredKernels::fsdp_hook(int version, const std::string& sharding,
                                                            const std::string& phase) const {
  const auto v = fsdp_hooks.find(version);
  return v == fsdp_hooks.end() ? nullptr : line_at(v->second, sharding, phase);
}

const MeasuredKernels::HookLine* MeasuredKernels::ddp_hook(const std::string& mode, const std::string& phase) const {
  return line_at(ddp_hooks, mode, phase);
}

DeviceProfile parse_profile(const std::string& json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    // nlohmann's message is one line: "[json.exception.parse_error.101] ...".
    throw std::invalid_argument("device profile " + origin + ": malformed JSON: " + e.what());
  }
  if (!root.is_object())
    throw std::invalid_argument("device profile " + origin +
                                ": malformed JSON: top level must be an object");
  ProfileReader r(root, origin);

  DeviceProfile p;
  p.path = origin;
  p.name = r.text("name");
  p.description = r.find("description") ? r.text("description") : "";
  std::string kind = r.text("kind");
  if (kind == "cuda") {
    p.kind = DeviceKind::kCuda;
  } else if (kind == "cpu") {
    p.kind = DeviceKind::kCpu;
  } else {
    r.fail("kind", "must be \"cuda\" or \"cpu\", not \"" + kind + "\"");
  }
  std::string allocator = r.text("allocator");
  if (allocator == "cuda_caching") {
    p.allocator = AllocatorKind::kCudaCaching;
  } else if (allocator == "exact") {
    p.allocator = AllocatorKind::kExact;
  } else {
    r.fail("allocator", "must be \"cuda_caching\" or \"exact\", not \"" + allocator + "\"");
  }
  p.memory_bytes = r.bytes("memory_bytes");
  if (p.kind == DeviceKind::kCuda && p.memory_bytes == 0)
    r.fail("memory_bytes", "must be > 0 for a cuda device");
  p.compute_capability = r.optional_number("compute_capability");
  if (p.compute_capability < 0) r.fail("compute_capability", "must be >= 0");
  const double sms = r.optional_number("sm_count");
  if (sms < 0 || sms > 1e6 || sms != static_cast<double>(static_cast<int64_t>(sms)))
    r.fail("sm_count", "must be a whole number >= 0");
  p.sm_count = static_cast<int64_t>(sms);
  p.cuda_context_bytes = r.bytes("overheads_bytes.cuda_context");
  p.cublas_workspace_allocations = r.bytes_list("overheads_bytes.cublas_workspace");
  for (int64_t b : p.cublas_workspace_allocations) {
    if (b > (int64_t{1} << 40)) r.fail("overheads_bytes.cublas_workspace", "more than 1 TiB");
    p.cublas_workspace_bytes += b;
  }
  p.nccl_buffers_bytes = r.bytes("overheads_bytes.nccl_buffers");

  p.fp32_flops_per_s = r.number("peak_flops_per_s.fp32");
  if (p.fp32_flops_per_s <= 0) r.fail("peak_flops_per_s.fp32", "must be > 0");
  p.fp16_flops_per_s = r.optional_number("peak_flops_per_s.fp16");
  p.bf16_flops_per_s = r.optional_number("peak_flops_per_s.bf16");

  p.memory_bytes_per_s = r.number("memory_bytes_per_s");
  p.gpu_link = {r.text("gpu_link.kind"), r.number("gpu_link.bytes_per_s"), r.optional_number("gpu_link.latency_s")};
  p.host_link = {r.text("host_link.kind"), r.number("host_link.bytes_per_s")};
  p.inter_node_link = {r.text("inter_node_link.kind"), r.number("inter_node_link.bytes_per_s")};
  p.host_memory_bytes_per_s = r.number("host_memory_bytes_per_s");
  // Rates divide bytes in the time model: zero would mean infinite time.
  for (const char* field : {"memory_bytes_per_s", "gpu_link.bytes_per_s", "host_link.bytes_per_s",
                            "inter_node_link.bytes_per_s", "host_memory_bytes_per_s"}) {
    if (r.number(field) <= 0) r.fail(field, "must be > 0");
  }

  ProfileEfficiency& e = p.efficiency;
  e.flops_fp32 = r.fraction("efficiency.flops.fp32");
  // A dtype the device supports needs an efficiency; one it lacks must not
  // have one, so a half-edited profile is caught.
  if (p.fp16_flops_per_s > 0) e.flops_fp16 = r.fraction("efficiency.flops.fp16");
  if (p.bf16_flops_per_s > 0) e.flops_bf16 = r.fraction("efficiency.flops.bf16");
  if (p.fp16_flops_per_s == 0 && r.find("efficiency.flops.fp16"))
    r.fail("efficiency.flops.fp16", "is given but peak_flops_per_s.fp16 is not");
  if (p.bf16_flops_per_s == 0 && r.find("efficiency.flops.bf16"))
    r.fail("efficiency.flops.bf16", "is given but peak_flops_per_s.bf16 is not");
  e.collective = r.fraction("efficiency.collective");
  e.host_link = r.fraction("efficiency.host_link");
  e.memory = r.fraction("efficiency.memory");
  e.host_memory = r.fraction("efficiency.host_memory");

  if (r.find("measured_kernels")) {
    MeasuredKernels& k = p.measured_kernels;
    k.op_overhead_s = r.number("measured_kernels.op_overhead_s");
    if (k.op_overhead_s <= 0) r.fail("measured_kernels.op_overhead_s", "must be > 0");
    const std::string dims_field = "measured_kernels.matmul_dims";
    const json& dims = r.need(dims_field);
    if (!dims.is_array() || dims.empty()) r.fail(dims_field, "must be a list of sizes");
    for (const json& d : dims) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1 ||
          (!k.matmul_dims.empty() && d.get<int64_t>() <= k.matmul_dims.back()))
        r.fail(dims_field, "must be a list of ascending whole numbers >= 1");
      k.matmul_dims.push_back(d.get<int64_t>());
    }
    const size_t cells = k.matmul_dims.size() * k.matmul_dims.size() * k.matmul_dims.size();
    const json& rates = r.need("measured_kernels.matmul_flops_per_s");
    if (!rates.is_object() || rates.empty())
      r.fail("measured_kernels.matmul_flops_per_s", "must be an object of dtype: rates");
    for (auto it = rates.begin(); it != rates.end(); ++it) {
      const std::string field = "measured_kernels.matmul_flops_per_s." + it.key();
      const std::optional<DType> dtype = dtype_named(it.key());
      if (!dtype) r.fail(field, "names no dtype (fp32, bf16 or fp16)");
      if (!it->is_array() || it->size() != cells)
        r.fail(field, "must be a list of " + std::to_string(cells) + " rates (matmul_dims cubed)");
      std::vector<double>& out = k.matmul_flops_per_s[*dtype];
      for (const json& v : *it) {
        if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
          r.fail(field, "must be a list of rates > 0");
        out.push_back(v.get<double>());
      }
      if (!p.supports(*dtype)) r.fail(field, "is given but peak_flops_per_s." + it.key() + " is not");
    }
    if (const json* by_dtype = r.find("measured_kernels.kernel_bytes_per_s")) {
      const std::string field = "measured_kernels.kernel_bytes_per_s";
      if (!by_dtype->is_object()) r.fail(field, "must be an object of dtype: {op: rate}");
      for (auto d = by_dtype->begin(); d != by_dtype->end(); ++d) {
        const std::optional<DType> dtype = dtype_named(d.key());
        if (!dtype || !d->is_object()) r.fail(field + "." + d.key(), "must be a dtype (fp32, bf16, fp16) of op: rate");
        for (auto it = d->begin(); it != d->end(); ++it) {
          if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>()))
            r.fail(field + "." + d.key() + "." + it.key(), "must be a rate > 0");
          k.kernel_bytes_per_s[*dtype][it.key()] = it->get<double>();
        }
      }
    }
    parse_pytorch_lines(r, k);
    k.broadcast_s = r.optional_number("measured_kernels.broadcast_s");
    k.ddp_buffers_s = r.optional_number("measured_kernels.ddp_buffers_s");
  }

  const json& sources = r.need("sources");
  if (!sources.is_object()) r.fail("sources", "must be an object");
  for (auto it = sources.begin(); it != sources.end(); ++it) {
    if (!it->is_string() || it->get<std::string>().empty())
      r.fail("sources." + it.key(), "must be a non-empty string");
    p.sources[it.key()] = it->get<std::string>();
  }
  std::vector<std::string> numeric_paths;
  collect_numeric_paths(root, "", &numeric_paths);
  for (const std::string& field : numeric_paths) {
    if (!p.sources.count(field))
      r.fail(field,
             "has no entry in 'sources' (say where the number came "
             "from: datasheet, measured (date, how), or estimate: why)");
  }
  return p;
}

bool is_profile_path(const std::string& name_or_path) {
  return name_or_path.find('/') != std::string::npos || ends_with(name_or_path, ".json");
}

std::string profile_file(const std::string& name_or_path, const std::string& profiles_dir) {
  return is_profile_path(name_or_path) ? name_or_path : profiles_dir + "/" + name_or_path + ".json";
}

DeviceProfile load_profile(const std::string& name_or_path, const std::string& profiles_dir) {
  if (is_profile_path(name_or_path)) return parse_profile(read_file(name_or_path), name_or_path);

  std::vector<std::string> known = list_profiles(profiles_dir);
  if (std::find(known.begin(), known.end(), name_or_path) == known.end()) {
    throw std::invalid_argument("unknown device profile '" + name_or_path + "' (known: " +
                                (known.empty() ? "none in " + profiles_dir : join(known, ", ")) +
                                "; or give a path to a .json profile)");
  }
  const std::string path = profile_file(name_or_path, profiles_dir);
  DeviceProfile p = parse_profile(read_file(path), path);
  if (p.name != name_or_path) {
    throw std::invalid_argument("device profile " + path + ": field 'name' is '" + p.name +
                                "' but the file is " + name_or_path + ".json");
  }
  return p;
}

std::vector<std::string> list_profiles(const std::string& profiles_dir) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(profiles_dir.c_str());
  if (!dir) return names;
  while (const dirent* entry = ::readdir(dir)) {
    std::string file = entry->d_name;
    if (ends_with(file, ".json") && file.size() > 5)
      names.push_back(file.substr(0, file.size() - 5));
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string find_profiles_dir(const std::vector<std::string>& candidate_dirs) {
  if (const char* env = std::getenv("SHARDFIT_PROFILES"); env && *env) {
    // An explicit setting that points nowhere is a mistake to report, not a
    // reason to silently fall back to another directory.
    if (!is_directory(env))
      throw std::invalid_argument(std::string("SHARDFIT_PROFILES='") + env +
                                  "' is not a directory");
    return env;
  }
  for (const std::string& dir : candidate_dirs) {
    if (is_directory(dir) && !list_profiles(dir).empty()) return dir;
  }
  throw std::invalid_argument(
      "no device profiles directory found (looked in: " +
      (candidate_dirs.empty() ? std::string("nothing") : join(candidate_dirs, ", ")) +
      "); set SHARDFIT_PROFILES to the profiles/ directory");
}

std::vector<std::string> default_profile_dirs(const std::string& exe_path) {
  std::string exe_dir = ".";
  size_t slash = exe_path.rfind('/');
  if (slash != std::string::npos) exe_dir = exe_path.substr(0, slash);
  if (exe_dir.empty()) exe_dir = "/";
  return {exe_dir + "/../profiles", exe_dir + "/../share/shardfit/profiles",
          exe_dir + "/../../profiles"};
}

int64_t parse_size_bytes(const std::string& text) {
  auto bad = [&](const std::string& why) -> std::invalid_argument {
    return std::invalid_argument("bad size '" + text + "': " + why +
                                 " (examples: 24GiB, 512MiB, 1.5GB, 123456 for bytes)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t number_begin = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size()) {
    char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++i;
  }
  if (!seen_digit) {
    throw bad(i < text.size() && text[i] == '-' ? "must not be negative" : "expected a number");
  }
  std::string number = text.substr(number_begin, i - number_begin);
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i++])));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw bad("unexpected text after the unit");

  static const std::map<std::string, double> kUnits = {
      {"", 1},
      {"b", 1},
      {"kib", 1024.0},
      {"mib", 1024.0 * 1024},
      {"gib", 1024.0 * 1024 * 1024},
      {"tib", 1024.0 * 1024 * 1024 * 1024},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
  };
  auto unit_it = kUnits.find(unit);
  if (unit_it == kUnits.end()) {
    // "24G" is ambiguous (GiB for Slurm and PyTorch, GB on the box): ask.
    throw bad("unknown unit '" + unit +
              "', use B, KiB, MiB, GiB, TiB, KB, MB, "
              "GB or TB");
  }
  double value = std::strtod(number.c_str(), nullptr) * unit_it->second;
  // 2^63 is exactly representable; anything at or past it overflows int64.
  if (!(value < 9223372036854775808.0)) throw bad("too large");
  double whole = std::round(value);
  if (std::fabs(value - whole) > 1e-6 * std::max(1.0, value) && unit_it->second == 1) {
    throw bad("a byte count must be a whole number");
  }
  return static_cast<int64_t>(whole);
}

std::string format_size(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double abs = b < 0 ? -b : b;
  char buf[64];
  if (abs >= 1024.0 * 1024 * 1024) return format_gib(bytes);
  if (abs >= 1024.0 * 1024)
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1024.0 * 1024));
  else if (abs >= 1024.0)
    std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

std::string format_gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace shardfit::planner
