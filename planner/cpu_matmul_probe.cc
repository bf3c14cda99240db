// LibTorch 2.x's bf16 matrix products on a CPU allocate more than their
// output: on a CPU with AVX-512 they go to oneDNN (through ideep:
// aten/src/ATen/native/mkldnn/Matmul.cpp), which takes a scratchpad from
// LibTorch's CPU allocator for the length of the call (brgemm's packed
// operands and fp32 accumulators, per thread, blocked for the ISA and the
// cache sizes), and copy an operand first when its strides do not suit. The
// size is oneDNN's own arithmetic. LibTorch 1.13 loads oneDNN 2 as a shared
// library whose C API the tracer asks (planner/meta_kernels.cc); the 2.x
// wheels link oneDNN 3 statically and export none of it. So here the kernel
// itself is asked: it runs once on CPU tensors of the same sizes and strides
// under the same thread count, and every CPU allocation it makes on this
// thread is recorded. The output is preallocated (the _out form, which the
// functional op's structured kernel shares), so what is recorded is exactly
// what the op adds to it. A step repeats a few shapes; each is run once, and
// its result is kept on disk for the next process (below): running the
// kernel is slow at large shapes (minutes for GPT-2 at 1,024 tokens on a CPU
// without bf16 instructions), its result is not.
#include "planner/cpu_matmul_probe.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "planner/probe_cpu_allocator.h"
#include "reports/machine.h"

namespace shardfit::planner {
namespace {

// The probe running on this thread: its events (as probe_cpu_bf16_matmul
// returns them) and which of its allocations each live address is.
struct Sink {
  std::vector<int64_t> events;
  std::unordered_map<const void*, int64_t> index;
  int64_t allocations = 0;
};
thread_local Sink* t_sink = nullptr;

bool observe_alloc(const void* data, size_t nbytes) {
  if (!t_sink) return false;
  t_sink->events.push_back(static_cast<int64_t>(nbytes));
  t_sink->index[data] = t_sink->allocations++;
  return true;  // follow it to its free
}

void observe_free(const void* data) {
  if (!t_sink) return;
  auto it = t_sink->index.find(data);
  if (it == t_sink->index.end()) return;
  t_sink->events.push_back(-(it->second + 1));
  t_sink->index.erase(it);
}

// Installed once, wrapping the CPU allocator of the moment (LibTorch's, or
// `shardfit run`'s meter, which in turn wraps this one if it comes later:
// both are priority 100, and c10 lets an equal priority replace).
void install_recorder() {
  static ProbeCpuAllocator* recorder = [] {
    auto* r = new ProbeCpuAllocator(c10::GetCPUAllocator(), &observe_alloc, &observe_free);  // outlives storages
    c10::SetCPUAllocator(r, /*priority=*/100);
    return r;
  }();
  (void)recorder;
}

at::Tensor cpu_like(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type())).zero_();
}

float scalar(c10::ArrayRef<const c10::IValue> in, size_t i) {
  return in.size() > i && in[i].isScalar() ? in[i].toScalar().to<float>() : 1.0f;
}

bool bf16(c10::ArrayRef<const c10::IValue> in, size_t i) {
  return in.size() > i && in[i].isTensor() && in[i].toTensor().scalar_type() == at::kBFloat16;
}

enum class Product { kMm, kAddmm, kBmm, kBaddbmm };

std::vector<int64_t> run(Product p, c10::ArrayRef<const c10::IValue> in, int threads) {
  // The probe's own ops are not the traced step's: no callbacks (the tracer's
  // included), no autograd, no autocast.
  at::RecordFunctionGuard no_callbacks(/*is_enabled=*/false);
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  install_recorder();
  const bool add = p == Product::kAddmm || p == Product::kBaddbmm;
  const at::Tensor a = cpu_like(in[add ? 1 : 0].toTensor());
  const at::Tensor b = cpu_like(in[add ? 2 : 1].toTensor());
  const at::Tensor self = add ? cpu_like(in[0].toTensor()) : at::Tensor();
  const bool batched = p == Product::kBmm || p == Product::kBaddbmm;
  at::Tensor out = batched ? at::empty({a.size(0), a.size(1), b.size(2)}, a.options())
                           : at::empty({a.size(0), b.size(1)}, a.options());
  Sink sink;
  {
    // This thread's allocations go to `sink`, under `threads` intra-op threads, until the product returns.
    struct Active {
      Active(Sink* s, int threads) : saved_threads(at::get_num_threads()) {
        at::set_num_threads(threads);
        t_sink = s;
      }
      ~Active() {
        t_sink = nullptr;
        at::set_num_threads(saved_threads);
      }
      int saved_threads;
    } active(&sink, threads);
    switch (p) {
      case Product::kMm: at::mm_out(out, a, b); break;
      case Product::kAddmm: at::addmm_out(out, self, a, b, scalar(in, 3), scalar(in, 4)); break;
      case Product::kBmm: at::bmm_out(out, a, b); break;
      case Product::kBaddbmm: at::baddbmm_out(out, self, a, b, scalar(in, 3), scalar(in, 4)); break;
    }
  }
  return std::move(sink.events);
}

// ---- kept across processes ----------------------------------------------------
// One line per probe in the file: the machine key, a tab, the probe's key,
// a tab, its events separated by spaces. A result holds for the kernel that
// made it: the LibTorch (its oneDNN), the CPU's ISA flags and L2 size
// (oneDNN blocks its scratchpad for them) and oneDNN's ISA cap if one is
// set; the threads are in the probe's key. Lines of another machine key are
// left alone, so one cache serves several machines and versions.

const std::string& machine_key() {
  static const std::string key = [] {
    const reports::Machine m = reports::this_machine(1);
    // "probe 1": what run() records; a change to it changes the number.
    std::string k = std::string("probe 1; libtorch ") + TORCH_VERSION + "; l2 " + std::to_string(m.l2_cache_bytes) + "; isa";
    for (const std::string& f : m.isa_flags) k += " " + f;
    for (const char* var : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
      if (const char* v = std::getenv(var)) k += std::string("; ") + var + "=" + v;
    return k;
  }();
  return key;
}

// SHARDFIT_CACHE_DIR, else $XDG_CACHE_HOME/shardfit, else ~/.cache/shardfit;
// empty (no file kept) when SHARDFIT_CACHE_DIR is "off" or no home is known.
std::filesystem::path kept_probes_file() {
  const char* dir = std::getenv("SHARDFIT_CACHE_DIR");
  if (dir && std::string(dir) == "off") return {};
  std::filesystem::path base;
  if (dir && *dir) {
    base = dir;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    base = std::filesystem::path(xdg) / "shardfit";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::filesystem::path(home) / ".cache" / "shardfit";
  } else {
    return {};
  }
  return base / "cpu-bf16-matmul-probes.tsv";
}

// This machine's kept probes; a line that does not parse is skipped, and so
// is a last line with no newline yet (another process's append in flight).
std::map<std::string, std::vector<int64_t>> read_kept_probes() {
  std::map<std::string, std::vector<int64_t>> out;
  const std::filesystem::path path = kept_probes_file();
  if (path.empty()) return out;
  std::ifstream f(path);
  std::stringstream whole;
  whole << f.rdbuf();
  std::string text = whole.str();
  text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  std::istringstream lines(text);
  const std::string mine = machine_key() + "\t";
  std::string line;
  int64_t skipped = 0;
  while (std::getline(lines, line)) {
    if (line.compare(0, mine.size(), mine) != 0) continue;
    const size_t tab = line.find('\t', mine.size());
    if (tab == std::string::npos) {
      ++skipped;
      continue;
    }
    std::vector<int64_t> events;
    std::istringstream numbers(line.substr(tab + 1));
    std::string word;
    bool ok = true;
    while (ok && numbers >> word) {
      char* end = nullptr;
      const long long v = std::strtoll(word.c_str(), &end, 10);
      ok = end != word.c_str() && *end == '\0';
      events.push_back(v);
    }
    if (!ok) {
      ++skipped;
      continue;
    }
    out[line.substr(mine.size(), tab - mine.size())] = std::move(events);
  }
  if (skipped > 0) spdlog::debug("{}: {} malformed line(s) skipped", path.string(), skipped);
  return out;
}

// Appends one probe's line: one write(2) with O_APPEND, so processes that
// plan at once add whole lines. A file that cannot be written costs only
// the next process's time.
void keep_probe(const std::string& key, const std::vector<int64_t>& events) {
  const std::filesystem::path path = kept_probes_file();
  if (path.empty()) return;
  std::string line = machine_key() + "\t" + key + "\t";
  for (size_t i = 0; i < events.size(); ++i) line += (i ? " " : "") + std::to_string(events[i]);
  line += "\n";
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  const bool written = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) ::close(fd);
  if (!written) spdlog::debug("{}: cannot keep a matmul probe there", path.string());
}

}  // namespace

std::vector<int64_t> probe_cpu_bf16_matmul(const char* op, c10::ArrayRef<const c10::IValue> in, int threads) {
  // Schemas: mm(self, mat2), bmm(self, mat2), addmm(self, mat1, mat2, beta, alpha),
  // baddbmm(self, batch1, batch2, beta, alpha).
  Product p;
  if (std::strcmp(op, "aten::mm") == 0 && bf16(in, 0) && bf16(in, 1))
    p = Product::kMm;
  else if (std::strcmp(op, "aten::addmm") == 0 && bf16(in, 1) && bf16(in, 2) && in[0].isTensor())
    p = Product::kAddmm;
  else if (std::strcmp(op, "aten::bmm") == 0 && bf16(in, 0) && bf16(in, 1))
    p = Product::kBmm;
  else if (std::strcmp(op, "aten::baddbmm") == 0 && bf16(in, 1) && bf16(in, 2) && in[0].isTensor())
    p = Product::kBaddbmm;
  else
    return {};
  // The key: the op, every tensor's dtype, sizes and strides, the scalars, the threads.
  std::string key = std::string(op) + "/" + std::to_string(threads);
  for (const c10::IValue& v : in) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      key += "|" + std::string(c10::toString(t.scalar_type()));
      for (int64_t s : t.sizes()) key += " " + std::to_string(s);
      key += ":";
      for (int64_t s : t.strides()) key += " " + std::to_string(s);
    } else if (v.isScalar()) {
      key += "|" + std::to_string(v.toScalar().to<double>());
    }
  }
  static std::mutex mu;
  static std::map<std::string, std::vector<int64_t>> cache = read_kept_probes();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::vector<int64_t> events = run(p, in, threads);
  keep_probe(key, events);
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(std::move(key), std::move(events)).first->second;
}

}  // namespace shardfit::planner
