// Internal to the checkpoint layer (executor/checkpoint*.cc,
// executor/safetensors.cc): file I/O that names the file in every error,
// crash-safe writes, JSON field access, the dtype table, the tensor table
// shared by rank files and safetensors, and the data checksums. No
// LibTorch: the readers built on it are fuzzed (tests/fuzz) and run under
// ASan+UBSan.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardfit::executor::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

// safetensors refuses larger headers (safetensors/src/tensor.rs,
// MAX_HEADER_SIZE); so do we, before allocating for one. Rank file headers
// are held to the same bound.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Streaming copies and checksums go through buffers of at most this size.
constexpr int64_t kCopyChunkBytes = 64 << 20;

// std::invalid_argument "<file>: <problem>".
[[noreturn]] void bad(const fs::path& file, const std::string& problem);
std::string os_error(int err);

// ---------------------------------------------------------------- dtypes

struct DTypeInfo {
  const char* name;  // safetensors' spelling
  int64_t bytes;
  bool floating;
};
// nullptr for a name not in the table (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL).
const DTypeInfo* dtype_by_name(const std::string& name);

std::string shape_string(const std::vector<int64_t>& shape);
// Product of dims, or -1 when a dim is negative or the product overflows.
int64_t checked_numel(const std::vector<int64_t>& shape);

// ------------------------------------------------------------- hashing

uint64_t fnv1a64(const std::string& bytes);
std::string hex64(uint64_t v);
// XXH3-64 of a buffer, as 16 lowercase hex digits: the data checksum.
std::string xxh3_hex(const void* data, size_t n);
// XXH3-64 over pieces fed in order (the same value as one xxh3_hex call).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&& o) noexcept : state_(o.state_) { o.state_ = nullptr; }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t n);
  std::string hex() const;

 private:
  void* state_;
};
// A checksum as stored: 16 lowercase hex digits.
bool is_checksum(const std::string& s);

void put_u64_le(std::string* out, uint64_t v);
uint64_t get_u64_le(const unsigned char* p);

// Test hook behind inject_write_failure_for_testing (checkpoint.h).
void set_fail_write_after_bytes(int64_t bytes);

// A file opened for reading; errors name it.
class ReadFile {
 public:
  explicit ReadFile(fs::path path) : path_(std::move(path)) {
    // O_NONBLOCK: a FIFO named as a checkpoint must not block the open.
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
  explicit AtomicFileWriter(fs::path final_path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(const void* data, int64_t n) { write_at(end_, data, n); }
  void write_at(int64_t offset, const void* data, int64_t n);
  void commit();

 private:
  [[noreturn]] void fail(int err, const std::string& what) const;

  fs::path final_;
  fs::path tmp_;
  int fd_ = -1;
  int64_t end_ = 0;
  int64_t written_ = 0;
  int64_t fail_after_bytes_;
  bool committed_ = false;
};

// ----------------------------------------------------------- JSON access

json parse_json(const fs::path& file, const std::string& text, const std::string& what);
const json& field(const fs::path& file, const json& obj, const char* key, const std::string& where);
int64_t int_field(const fs::path& file, const json& obj, const char* key, const std::string& where,
                  int64_t min = 0);
std::string string_field(const fs::path& file, const json& obj, const char* key,
                         const std::string& where);
std::vector<int64_t> shape_field(const fs::path& file, const json& obj, const char* key,
                                 const std::string& where);

// ----------------------------------------------------------- tensor table

struct TensorEntry {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0;  // byte offsets within the data section
  int64_t end = 0;
  std::string checksum;  // xxh3 hex of the data; "" when the file carries none
  int64_t bytes() const { return end - begin; }
};

// {"name": {"dtype", "shape", "data_offsets"[, "xxh3"]}} -> entries in offset
// order, checked to tile [0, data_bytes) exactly. `skip_key` names a
// non-tensor entry ("__metadata__" in safetensors).
std::vector<TensorEntry> parse_tensor_table(const fs::path& file, const json& table,
                                            int64_t data_bytes, const std::string& skip_key);

// Header text: JSON padded with spaces so that the data after it starts at
// a multiple of 8 from the start of the file (given `preamble` bytes before).
std::string padded_header(const json& header, int64_t preamble);

// A file without checksums (Hugging Face's own safetensors): every value of
// a floating tensor (F32, BF16, F16) is read and must be finite; a NaN or an
// Inf, which no trained weight holds, is "<file>: tensor '<name>': element
// N is NaN or Inf". Other dtypes are not read. Returns the bytes read.
int64_t verify_tensor_finite(const ReadFile& f, int64_t data_start, const TensorEntry& e);
// Reads e's bytes (at data_start + e.begin) in chunks and checks them
// against `want` (16 hex digits). Throws std::invalid_argument "<file>:
// tensor '<name>': data checksum mismatch ..." when they differ.
void verify_tensor_data(const ReadFile& f, int64_t data_start, const TensorEntry& e,
                        const std::string& want);
// The same check for bytes already in memory.
void check_checksum(const fs::path& file, const TensorEntry& e, const std::string& want,
                    const void* data);

}  // namespace shardfit::executor::ckpt
