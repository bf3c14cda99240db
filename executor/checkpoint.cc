#include "executor/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace shardfit::executor {

// Tensor bytes go to disk as they sit in memory; the format says
// little-endian, so a big-endian host would need byte swaps nobody tests.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint format is little-endian");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kRankMagic[8] = {'S', 'H', 'R', 'D', 'F', 'I', 'T', '1'};
constexpr int64_t kRankPreambleBytes = 16;  // magic + header length
constexpr const char* kRankFormat = "shardfit.rank/1";
constexpr const char* kManifestFormat = "shardfit.checkpoint/1";
constexpr const char* kManifestName = "manifest.json";
// safetensors refuses larger headers (safetensors/src/tensor.rs,
// MAX_HEADER_SIZE); so do we, before allocating for one.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// export_safetensors copies through a buffer of at most this many bytes.
constexpr int64_t kCopyChunkBytes = 64 << 20;

std::atomic<int64_t> g_fail_write_after_bytes{-1};

[[noreturn]] void bad(const fs::path& file, const std::string& problem) {
  throw std::invalid_argument(file.string() + ": " + problem);
}

std::string os_error(int err) { return std::strerror(err); }

// ---------------------------------------------------------------- dtypes

struct DTypeInfo {
  const char* name;  // safetensors' spelling
  c10::ScalarType type;
  int64_t bytes;
};

constexpr DTypeInfo kDTypes[] = {
    {"F64", c10::ScalarType::Double, 8}, {"F32", c10::ScalarType::Float, 4},
    {"F16", c10::ScalarType::Half, 2},   {"BF16", c10::ScalarType::BFloat16, 2},
    {"I64", c10::ScalarType::Long, 8},   {"I32", c10::ScalarType::Int, 4},
    {"I16", c10::ScalarType::Short, 2},  {"I8", c10::ScalarType::Char, 1},
    {"U8", c10::ScalarType::Byte, 1},    {"BOOL", c10::ScalarType::Bool, 1},
};

const DTypeInfo* dtype_by_name(const std::string& name) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DTypeInfo* dtype_of(c10::ScalarType type) {
  for (const DTypeInfo& d : kDTypes)
    if (type == d.type) return &d;
  return nullptr;
}

bool is_floating(const DTypeInfo* d) {
  return d->type == c10::ScalarType::Double || d->type == c10::ScalarType::Float ||
         d->type == c10::ScalarType::Half || d->type == c10::ScalarType::BFloat16;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Product of dims, or -1 when a dim is negative or the product overflows.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// --------------------------------------------------------------- raw I/O

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void put_u64_le(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A file opened for reading; errors name it.
class ReadFile {
 public:
  explicit ReadFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) bad(path_, "cannot open (" + os_error(errno) + ")");
    struct stat st {};
    const bool stat_ok = ::fstat(fd_, &st) == 0;
    const int err = errno;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
      ::close(fd_);  // the destructor does not run for a throwing constructor
      bad(path_, stat_ok ? "not a regular file" : "cannot stat (" + os_error(err) + ")");
    }
    size_ = st.st_size;
  }
  ~ReadFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  ReadFile(ReadFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) {
    o.fd_ = -1;
  }

  const fs::path& path() const { return path_; }
  int64_t size() const { return size_; }

  // Callers check ranges against size() first, so a short read means the
  // file changed under us or the device failed.
  void read_at(int64_t offset, void* dst, int64_t n) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, static_cast<size_t>(n), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        bad(path_, "read failed at byte " + std::to_string(offset) + " (" + os_error(errno) + ")");
      if (got == 0)
        bad(path_, "ends at byte " + std::to_string(offset) + " while reading (truncated?)");
      p += got;
      offset += got;
      n -= got;
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Writes `<final>.tmp.<pid>` and renames it over `final` on commit(); if
// commit() is never reached the temporary is removed and `final` is untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(fs::path final_path)
      : final_(std::move(final_path)),
        tmp_(final_.string() + ".tmp." + std::to_string(::getpid())),
        fail_after_bytes_(g_fail_write_after_bytes.exchange(-1)) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(errno, "cannot create " + tmp_.string());
  }
  ~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(const void* data, int64_t n) { write_at(end_, data, n); }

  void write_at(int64_t offset, const void* data, int64_t n) {
    const char* p = static_cast<const char*>(data);
    end_ = std::max(end_, offset + n);
    while (n > 0) {
      int64_t chunk = n;
      if (fail_after_bytes_ >= 0) {
        chunk = std::min(chunk, fail_after_bytes_ - written_);
        if (chunk <= 0) fail(ENOSPC, "write failed");
      }
      const ssize_t put = ::pwrite(fd_, p, static_cast<size_t>(chunk), offset);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) fail(errno, "write failed");
      p += put;
      offset += put;
      n -= put;
      written_ += put;
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail(errno, "fsync failed");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(errno, "close failed");
    if (::rename(tmp_.c_str(), final_.c_str()) != 0)
      fail(errno, "rename from " + tmp_.string() + " failed");
    committed_ = true;
    // The rename is durable only once the directory entry is on disk.
    fs::path dir = final_.parent_path();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail(errno, "cannot open its directory to fsync it");
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    // Some file systems cannot fsync a directory (EINVAL); the rename stands.
    if (rc != 0 && err != EINVAL) fail(err, "fsync of its directory failed");
  }

 private:
  [[noreturn]] void fail(int err, const std::string& what) const {
    throw std::runtime_error(final_.string() + ": " + what + " (" + os_error(err) + ")" +
                             (committed_ ? "" : "; the previous file, if any, is untouched"));
  }

  fs::path final_;
  fs::path tmp_;
  int fd_ = -1;
  int64_t end_ = 0;
  int64_t written_ = 0;
  int64_t fail_after_bytes_;
  bool committed_ = false;
};

// ----------------------------------------------------------- JSON access

json parse_json(const fs::path& file, const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    bad(file, what + " is not valid JSON (parse error at byte " + std::to_string(e.byte) + ")");
  }
}

const json& field(const fs::path& file, const json& obj, const char* key,
                  const std::string& where) {
  if (!obj.is_object()) bad(file, where + " is not a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) bad(file, where + " has no '" + key + "'");
  return *it;
}

int64_t int_field(const fs::path& file, const json& obj, const char* key, const std::string& where,
                  int64_t min = 0) {
  const json& v = field(file, obj, key, where);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
      v.get<int64_t>() < min) {
    bad(file, where + "." + key + " is " + v.dump() + ", not an integer >= " + std::to_string(min));
  }
  return v.get<int64_t>();
}

std::string string_field(const fs::path& file, const json& obj, const char* key,
                         const std::string& where) {
  const json& v = field(file, obj, key, where);
  if (!v.is_string()) bad(file, where + "." + key + " is not a string");
  return v.get<std::string>();
}

std::vector<int64_t> shape_field(const fs::path& file, const json& obj, const char* key,
                                 const std::string& where) {
  const json& v = field(file, obj, key, where);
  if (!v.is_array()) bad(file, where + "." + key + " is not an array");
  std::vector<int64_t> shape;
  for (const json& d : v) {
    if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > INT64_MAX) ||
        d.get<int64_t>() < 0) {
      bad(file, where + "." + key + " " + v.dump() + " holds a non-dimension");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// ----------------------------------------------------------- tensor table

struct TensorEntry {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0;  // byte offsets within the data section
  int64_t end = 0;
  int64_t bytes() const { return end - begin; }
};

// {"name": {"dtype", "shape", "data_offsets"}} -> entries in offset order,
// checked to tile [0, data_bytes) exactly.
std::vector<TensorEntry> parse_tensor_table(const fs::path& file, const json& table,
                                            int64_t data_bytes, const std::string& skip_key) {
  if (!table.is_object()) bad(file, "tensor table is not a JSON object");
  std::vector<TensorEntry> entries;
  for (auto it = table.begin(); it != table.end(); ++it) {
    if (it.key() == skip_key) continue;
    const std::string where = "tensor '" + it.key() + "'";
    if (it.key().empty()) bad(file, "a tensor has an empty name");
    TensorEntry e;
    e.name = it.key();
    const std::string dtype = string_field(file, it.value(), "dtype", where);
    e.dtype = dtype_by_name(dtype);
    if (!e.dtype) bad(file, where + " has unsupported dtype '" + dtype + "'");
    e.shape = shape_field(file, it.value(), "shape", where);
    e.numel = checked_numel(e.shape);
    int64_t nbytes = 0;
    if (e.numel < 0 || __builtin_mul_overflow(e.numel, e.dtype->bytes, &nbytes))
      bad(file, where + " shape " + shape_string(e.shape) + " overflows");
    const json& offsets = field(file, it.value(), "data_offsets", where);
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned() || offsets[1].get<uint64_t>() > INT64_MAX ||
        offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>()) {
      bad(file,
          where + " data_offsets " + offsets.dump() + " is not [begin, end] with begin <= end");
    }
    e.begin = offsets[0].get<int64_t>();
    e.end = offsets[1].get<int64_t>();
    if (e.bytes() != nbytes) {
      bad(file, where + " spans " + std::to_string(e.bytes()) + " bytes, but " + dtype + " " +
                    shape_string(e.shape) + " needs " + std::to_string(nbytes));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  int64_t at = 0;
  for (const TensorEntry& e : entries) {
    if (e.begin != at) {
      bad(file, "tensor '" + e.name + "' starts at data byte " + std::to_string(e.begin) +
                    ", expected " + std::to_string(at) +
                    " (tensors must tile the data, no gap or overlap)");
    }
    at = e.end;
  }
  if (at != data_bytes) {
    bad(file, "tensors cover " + std::to_string(at) + " data bytes, the data section has " +
                  std::to_string(data_bytes) + " (truncated or corrupt)");
  }
  return entries;
}

// Header text: JSON padded with spaces so that the data after it starts at
// a multiple of 8 from the start of the file (given `preamble` bytes before).
std::string padded_header(const json& header, int64_t preamble) {
  std::string text = header.dump();
  while ((preamble + static_cast<int64_t>(text.size())) % 8 != 0) text.push_back(' ');
  return text;
}

// A contiguous CPU view of t (a copy only when it has to be).
torch::Tensor host_contiguous(const torch::Tensor& t) {
  torch::Tensor h = t.device().is_cpu() ? t : t.to(torch::kCPU);
  return h.contiguous();
}

// ----------------------------------------------------------- unit layouts

json unit_to_json(const UnitShardLayout& u, bool with_shard) {
  json params = json::array();
  for (const planner::FlatParamEntry& p : u.params)
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
    planner::FlatParamEntry p;
    p.name = string_field(file, params[i], "name", pw);
    p.shape = shape_field(file, params[i], "shape", pw);
    p.numel = int_field(file, params[i], "numel", pw);
    p.offset = int_field(file, params[i], "offset", pw);
    u.params.push_back(std::move(p));
  }
  return u;
}

struct TensorSig {
  const DTypeInfo* dtype;
  std::vector<int64_t> shape;
};

// Every unit follows the padding rule and its param_tensor is a 1-D
// floating tensor of shard_numel elements; unit and parameter names are
// unique.
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
    std::vector<planner::ParamInfo> infos;
    for (const planner::FlatParamEntry& p : u.params) {
      if (p.name.empty()) bad(file, where + " has a parameter with an empty name");
      if (!param_names.insert(p.name).second) bad(file, "parameter '" + p.name + "' appears twice");
      if (checked_numel(p.shape) != p.numel) {
        bad(file, where + " parameter '" + p.name + "' has numel " + std::to_string(p.numel) +
                      " but shape " + shape_string(p.shape));
      }
      infos.push_back(planner::ParamInfo{p.name, p.shape, p.numel});
    }
    const planner::FlatParamLayout layout(infos, u.shard_group_size);
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
    if (t->second.shape != want || !is_floating(t->second.dtype)) {
      bad(file, where + " param_tensor '" + u.param_tensor + "' is " + t->second.dtype->name + " " +
                    shape_string(t->second.shape) + ", expected a floating " + shape_string(want));
    }
  }
}

// ------------------------------------------------------------- rank files

// A rank file's header, read and checked; the data is read on demand.
struct RankFile {
  explicit RankFile(const fs::path& path) : file(path) {}
  ReadFile file;
  int rank = 0;
  int world_size = 0;
  json metadata;
  std::vector<UnitShardLayout> units;
  std::vector<TensorEntry> tensors;  // in data order
  int64_t data_start = 0;
  std::string header_hash;  // fnv1a64 of the header bytes, hex

  const TensorEntry& tensor(const std::string& name) const {
    for (const TensorEntry& e : tensors)
      if (e.name == name) return e;
    bad(file.path(), "has no tensor '" + name + "'");
  }
};

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
  if (n > static_cast<uint64_t>(f.size() - kRankPreambleBytes) || n % 8 != 0) {
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
  const std::string format = string_field(path, m, "format", "manifest");
  if (format != kManifestFormat) bad(path, "format '" + format + "' is not " + kManifestFormat);
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
    e.header_hash = string_field(path, ranks[r], "header_fnv1a64", where);
    if (e.file != rank_file_name(r, out.world_size)) bad(path, where + ".file is '" + e.file + "'");
    out.ranks.push_back(std::move(e));
  }
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

void read_tensor_data(const RankFile& rf, const TensorEntry& e, const torch::Tensor& dst) {
  if (dst.is_contiguous() && dst.device().is_cpu()) {
    rf.file.read_at(rf.data_start + e.begin, dst.data_ptr(), e.bytes());
    return;
  }
  torch::Tensor tmp = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
  rf.file.read_at(rf.data_start + e.begin, tmp.data_ptr(), e.bytes());
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
      torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
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

// --------------------------------------------------------------- safetensors

struct SafetensorsPlan {
  std::string header;                          // padded JSON
  std::map<std::string, int64_t> data_offset;  // name -> begin within the data section
  int64_t data_bytes = 0;
};

SafetensorsPlan plan_safetensors(
    const std::map<std::string, std::pair<const DTypeInfo*, std::vector<int64_t>>>& tensors) {
  SafetensorsPlan plan;
  json header = json::object();
  for (const auto& [name, sig] : tensors) {
    const int64_t bytes = checked_numel(sig.second) * sig.first->bytes;
    header[name] = {{"dtype", sig.first->name},
                    {"shape", sig.second},
                    {"data_offsets", {plan.data_bytes, plan.data_bytes + bytes}}};
    plan.data_offset[name] = plan.data_bytes;
    plan.data_bytes += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  plan.header = padded_header(header, 8);
  return plan;
}

}  // namespace

// ================================================================= public

UnitShardLayout UnitShardLayout::from(std::string unit, std::string param_tensor,
                                      const planner::FlatParamLayout& layout, int shard_index) {
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

planner::FlatParamLayout UnitShardLayout::flat_layout() const {
  std::vector<planner::ParamInfo> infos;
  for (const planner::FlatParamEntry& p : params)
    infos.push_back(planner::ParamInfo{p.name, p.shape, p.numel});
  return planner::FlatParamLayout(infos, shard_group_size);
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
                   {"data_offsets", {data_bytes, data_bytes + bytes}}};
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

void export_safetensors(const fs::path& checkpoint_dir, const fs::path& out_path) {
  const Manifest m = read_manifest(checkpoint_dir);
  std::vector<RankFile> files;
  for (int r = 0; r < m.world_size; ++r) files.push_back(open_committed_rank(checkpoint_dir, m, r));

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
    for (const planner::FlatParamEntry& p : us.layout.params) {
      if (!sigs.emplace(p.name, std::make_pair(us.dtype, p.shape)).second)
        bad(checkpoint_dir, "parameter '" + p.name + "' is held by two units");
    }
  }

  const SafetensorsPlan plan = plan_safetensors(sigs);
  const int64_t data_start = 8 + static_cast<int64_t>(plan.header.size());
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
    const planner::FlatParamLayout layout = us.layout.flat_layout();
    const int64_t es = us.dtype->bytes;
    for (int s = 0; s < us.layout.shard_group_size; ++s) {
      const Source& src = us.shards[s];
      for (const planner::ShardPiece& piece : layout.pieces(s)) {
        const planner::FlatParamEntry& p = layout.params()[piece.param];
        const int64_t from = src.file->data_start + src.tensor->begin + piece.shard_offset * es;
        const int64_t to = data_start + plan.data_offset.at(p.name) + piece.param_offset * es;
        for (int64_t done = 0, total = piece.numel * es; done < total;) {
          const int64_t n = std::min(kCopyChunkBytes, total - done);
          buffer.resize(static_cast<size_t>(n));
          src.file->file.read_at(from + done, buffer.data(), n);
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
  const SafetensorsPlan plan = plan_safetensors(sigs);
  std::string preamble;
  put_u64_le(&preamble, plan.header.size());
  AtomicFileWriter out(path);
  out.append(preamble.data(), 8);
  out.append(plan.header.data(), static_cast<int64_t>(plan.header.size()));
  for (const auto& [name, t] : tensors) {  // map order, as planned
    const torch::Tensor h = host_contiguous(t);
    out.append(h.data_ptr(), h.numel() * static_cast<int64_t>(h.element_size()));
  }
  out.commit();
}

std::map<std::string, torch::Tensor> read_safetensors(const fs::path& path) {
  const ReadFile f(path);
  if (f.size() < 8)
    bad(path, "file is " + std::to_string(f.size()) + " bytes, too short for a safetensors header");
  unsigned char pre[8];
  f.read_at(0, pre, 8);
  const uint64_t n = get_u64_le(pre);
  if (n > kMaxSafetensorsHeaderBytes || n > static_cast<uint64_t>(f.size() - 8)) {
    bad(path, "header length " + std::to_string(n) + " does not fit the " +
                  std::to_string(f.size()) + "-byte file (truncated or not safetensors)");
  }
  std::string text(n, '\0');
  f.read_at(8, text.data(), static_cast<int64_t>(n));
  const json h = parse_json(path, text, "header");
  if (!h.is_object()) bad(path, "header is not a JSON object");
  if (auto meta = h.find("__metadata__"); meta != h.end()) {
    if (!meta->is_object()) bad(path, "__metadata__ is not a JSON object");
    for (const auto& v : *meta)
      if (!v.is_string()) bad(path, "__metadata__ values must be strings");
  }
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  const std::vector<TensorEntry> entries =
      parse_tensor_table(path, h, f.size() - data_start, "__metadata__");
  std::map<std::string, torch::Tensor> out;
  for (const TensorEntry& e : entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
    f.read_at(data_start + e.begin, t.data_ptr(), e.bytes());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void inject_write_failure_for_testing(int64_t bytes) {
  g_fail_write_after_bytes.store(bytes < 0 ? -1 : bytes);
}

}  // namespace shardfit::executor
