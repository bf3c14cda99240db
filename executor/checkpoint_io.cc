#include "executor/checkpoint_io.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <tuple>

namespace shardfit::executor::ckpt {

namespace {
std::atomic<int64_t> g_fail_write_after_bytes{-1};

constexpr DTypeInfo kDTypes[] = {
    {"F64", 8, true},  {"F32", 4, true},  {"F16", 2, true}, {"BF16", 2, true}, {"I64", 8, false},
    {"I32", 4, false}, {"I16", 2, false}, {"I8", 1, false}, {"U8", 1, false},  {"BOOL", 1, false},
};
}  // namespace

void bad(const fs::path& file, const std::string& problem) {
  throw std::invalid_argument(file.string() + ": " + problem);
}

std::string os_error(int err) { return std::strerror(err); }

void set_fail_write_after_bytes(int64_t bytes) {
  g_fail_write_after_bytes.store(bytes < 0 ? -1 : bytes);
}

const DTypeInfo* dtype_by_name(const std::string& name) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
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

std::string xxh3_hex(const void* data, size_t n) { return hex64(XXH3_64bits(data, n)); }

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() {
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void Xxh3Stream::update(const void* data, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}
std::string Xxh3Stream::hex() const {
  return hex64(XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)));
}

bool is_checksum(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// ------------------------------------------------------------ file writes

AtomicFileWriter::AtomicFileWriter(fs::path final_path)
    : final_(std::move(final_path)),
      tmp_(final_.string() + ".tmp." + std::to_string(::getpid())),
      fail_after_bytes_(g_fail_write_after_bytes.exchange(-1)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(errno, "cannot create " + tmp_.string());
}
AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}
void AtomicFileWriter::write_at(int64_t offset, const void* data, int64_t n) {
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

void AtomicFileWriter::commit() {
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

void AtomicFileWriter::fail(int err, const std::string& what) const {
  throw std::runtime_error(final_.string() + ": " + what + " (" + os_error(err) + ")" +
                           (committed_ ? "" : "; the previous file, if any, is untouched"));
}

// ----------------------------------------------------------- JSON access

json parse_json(const fs::path& file, const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    bad(file, what + " is not valid JSON (parse error at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    bad(file, what + " is not valid JSON (" + e.what() + ")");
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
                  int64_t min) {
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
    if (auto sum = it.value().find("xxh3"); sum != it.value().end()) {
      if (!sum->is_string() || !is_checksum(sum->get<std::string>()))
        bad(file, where + " xxh3 " + sum->dump() + " is not 16 lowercase hex digits");
      e.checksum = sum->get<std::string>();
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

// ------------------------------------------------------------- checksums

namespace {
[[noreturn]] void mismatch(const fs::path& file, const TensorEntry& e, const std::string& want,
                           const std::string& got) {
  bad(file, "tensor '" + e.name + "': data checksum mismatch (xxh3 " + got + ", the header says " +
                want + "): the data is corrupt");
}
}  // namespace

void verify_tensor_data(const ReadFile& f, int64_t data_start, const TensorEntry& e,
                        const std::string& want) {
  Xxh3Stream h;
  std::vector<char> buffer;
  for (int64_t done = 0; done < e.bytes();) {
    const int64_t n = std::min(kCopyChunkBytes, e.bytes() - done);
    buffer.resize(static_cast<size_t>(n));
    f.read_at(data_start + e.begin + done, buffer.data(), n);
    h.update(buffer.data(), static_cast<size_t>(n));
    done += n;
  }
  const std::string got = h.hex();
  if (got != want) mismatch(f.path(), e, want, got);
}

int64_t verify_tensor_finite(const ReadFile& f, int64_t data_start, const TensorEntry& e) {
  // IEEE 754: a value is NaN or Inf when its exponent bits are all ones.
  const std::string dtype = e.dtype->name;
  uint32_t mask = 0;
  if (dtype == "F32") mask = 0x7f800000u;
  if (dtype == "BF16") mask = 0x7f80u;
  if (dtype == "F16") mask = 0x7c00u;
  if (mask == 0) return 0;
  const int64_t elem = e.dtype->bytes;
  std::vector<char> buffer;
  for (int64_t done = 0; done < e.bytes();) {
    const int64_t n = std::min(kCopyChunkBytes, e.bytes() - done);
    buffer.resize(static_cast<size_t>(n));
    f.read_at(data_start + e.begin + done, buffer.data(), n);
    for (int64_t i = 0; i + elem <= n; i += elem) {
      uint32_t v = 0;
      std::memcpy(&v, buffer.data() + i, static_cast<size_t>(elem));  // little-endian hosts only (checkpoint.h)
      if ((v & mask) == mask)
        bad(f.path(), "tensor '" + e.name + "': element " + std::to_string((done + i) / elem) +
                          " is NaN or Inf, which no trained weight holds: the data is corrupt");
    }
    done += n;
  }
  return e.bytes();
}

void check_checksum(const fs::path& file, const TensorEntry& e, const std::string& want,
                    const void* data) {
  const std::string got = xxh3_hex(data, static_cast<size_t>(e.bytes()));
  if (got != want) mismatch(file, e, want, got);
}

}  // namespace shardfit::executor::ckpt
