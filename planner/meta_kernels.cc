// Meta kernels for the ops LibTorch 1.13 has none for, and what the target
// device's kernels allocate that a meta kernel cannot show. A meta kernel only
// computes output shapes and dtypes and allocates the outputs on kMeta, so
// the recording allocator sees exactly the storages the real kernel returns;
// a real kernel's own temporaries (CPU dropout's noise, a CPU bf16 matmul's
// oneDNN scratchpad) are imitated here for the device the trace targets.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <spdlog/spdlog.h>
#include <torch/library.h>
#include <torch/version.h>

#include "planner/cpu_matmul_probe.h"
#include "planner/trace.h"
#include "planner/trace_recorder.h"

namespace shardfit::planner {
namespace {

// Set by each recording, for its thread (trace_recorder.h): imitate CUDA's
// allocation choices (fp32 LayerNorm statistics for 2-byte inputs) or the
// CPU's (statistics in the input dtype).
thread_local bool g_target_cuda = true;

at::Tensor meta_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (dim < 0) dim += self.dim();
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_native_layer_norm(
    const at::Tensor& input, c10::IntArrayRef normalized_shape, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>&, double) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  auto stat_dtype = input.scalar_type();
  // The CPU's 2.x kernel takes a bf16/fp16 input with fp32 weights (under
  // autocast: a BERT MLM head's LayerNorm(gelu(dense(x)))) and keeps its
  // statistics in the weights' dtype (ATen/native/layer_norm.cpp
  // layer_norm_cpu: param_scalar_type of a mixed-type call).
  const bool mixed = weight && weight->defined() && weight->scalar_type() != input.scalar_type();
  if ((g_target_cuda || mixed) && (stat_dtype == at::kHalf || stat_dtype == at::kBFloat16)) stat_dtype = at::kFloat;
  auto out = at::empty(input.sizes(), input.options());
  auto mean = at::empty(stat_shape, input.options().dtype(stat_dtype));
  auto rstd = at::empty(stat_shape, input.options().dtype(stat_dtype));
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef, const at::Tensor&,
    const at::Tensor&, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  at::Tensor dx, dw, db;
  if (mask[0]) dx = at::empty(input.sizes(), grad_out.options());
  if (mask[1] && weight && weight->defined()) dw = at::empty(weight->sizes(), weight->options());
  if (mask[2] && bias && bias->defined()) db = at::empty(bias->sizes(), bias->options());
  return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor> meta_native_dropout(const at::Tensor& input, double,
                                                       c10::optional<bool>) {
  if (g_target_cuda) {  // one fused kernel (cuda/Dropout.cu dropout_cuda): the bool mask, then the output
    auto mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
    return {at::empty(input.sizes(), input.options()), mask};
  }
  // CPU (1.13 native_dropout_cpu): the byte mask, a bernoulli noise tensor in
  // the input's dtype, the output = input * noise * scale; the noise is freed
  // on return. Measured: the meter sees exactly this sequence.
  auto mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
  auto noise = at::empty(input.sizes(), input.options());
  auto out = at::empty(input.sizes(), input.options());
  return {out, mask};
}

at::Tensor meta_native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double) {
  if (g_target_cuda) return at::empty(grad.sizes(), grad.options());  // one fused kernel
  // CPU (1.13 native_dropout_backward: grad * mask * scale), two products:
  // the first casts the bool mask to grad's dtype (a TensorIterator copy,
  // freed when the product is made); the second wraps `scale` in an 8-byte
  // double tensor and casts it to grad's dtype for the length of the op;
  // the first product is freed on return. At the output, two grad-sized
  // tensors and the scalars are live: measured, the meter sees exactly this.
  at::Tensor product;
  {
    at::Tensor mask_cast;
    if (mask.scalar_type() != grad.scalar_type()) mask_cast = at::empty(grad.sizes(), grad.options());
    product = at::empty(grad.sizes(), grad.options());
  }
  auto wrapped_scale = at::empty({}, grad.options().dtype(at::kDouble));
  auto scale_cast = at::empty({}, grad.options());
  auto out = at::empty(grad.sizes(), grad.options());
  return out;
}

at::Tensor meta_embedding_dense_backward(const at::Tensor& grad, const at::Tensor&,
                                         int64_t num_weights, int64_t, bool) {
  return at::empty({num_weights, grad.size(-1)}, grad.options());
}

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

#if TORCH_VERSION_MAJOR < 2
// ---------------------------------------------------------------------------
// CPU bf16 matmuls: the oneDNN scratchpad (LibTorch 1.13; 2.x measures the
// kernel itself: planner/cpu_matmul_probe.cc).
//
// LibTorch 1.13 on a CPU with AVX-512 BW/VL/DQ (mkldnn_bf16_device_check)
// hands bf16 matrix products to oneDNN through ideep
// (aten/src/ATen/native/mkldnn/Matmul.cpp): mm and addmm from
// cpublas::gemm via mkldnn_bf16_gemm, bmm and baddbmm via mkldnn_matmul.
// ideep creates a oneDNN matmul primitive with a user-managed scratchpad and
// allocates that scratchpad from LibTorch's CPU allocator (ideep's engine
// allocator is c10's: IDeepRegistration.cpp) for the length of the call:
// brgemm's packed copy of B (and of A when A must be copied), an fp32
// accumulator and its batch descriptors, per thread, blocked for the ISA and
// the L2 size. fp32 takes other paths that allocate nothing extra. The size
// is oneDNN's own arithmetic, so the trace asks the same oneDNN (the
// libdnnl.so.2 LibTorch is linked against) for the scratchpad of the same
// primitive under the rank's thread count, rather than re-deriving oneDNN's
// blocking heuristics.
//
// oneDNN's C API is reached with dlsym: LibTorch has already loaded the
// library, and the build then needs neither libdnnl-dev nor a link-line
// change. The declarations follow oneDNN 2.x's dnnl.h (ABI-stable within
// major version 2); a missing library or another major version turns the
// rule off with one warning, and the prediction is then low by the
// scratchpads (a few percent).
namespace onednn {

using Status = int;                      // dnnl_status_t; dnnl_success = 0
constexpr int kCpuEngine = 1;            // dnnl_cpu
constexpr int kBf16 = 2;                 // dnnl_bf16
constexpr int kScratchpadUser = 1;       // dnnl_scratchpad_mode_user: as ideep sets it
constexpr int kQueryScratchpadMd = 136;  // dnnl_query_scratchpad_md
constexpr unsigned kRuntimeOmp = 2;      // DNNL_RUNTIME_OMP
constexpr int kMaxDims = 12;             // DNNL_MAX_NDIMS

// Opaque storage for dnnl_memory_desc_t (696 bytes in 2.x) and
// dnnl_matmul_desc_t (2800 bytes), with room to spare: only oneDNN reads them.
struct alignas(64) MemoryDesc {
  unsigned char bytes[2048];
};
struct alignas(64) MatmulDesc {
  unsigned char bytes[8192];
};
struct Version {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

struct Api {
  Status (*engine_create)(void** engine, int kind, size_t index) = nullptr;
  Status (*memory_desc_init_by_strides)(MemoryDesc*, int ndims, const int64_t* dims, int dtype,
                                        const int64_t* strides) = nullptr;
  Status (*matmul_desc_init)(MatmulDesc*, const MemoryDesc* src, const MemoryDesc* weights,
                             const MemoryDesc* bias, const MemoryDesc* dst) = nullptr;
  Status (*attr_create)(void** attr) = nullptr;
  Status (*attr_destroy)(void* attr) = nullptr;
  Status (*attr_set_scratchpad_mode)(void* attr, int mode) = nullptr;
  Status (*attr_set_output_scales)(void* attr, int64_t count, int mask, const float* scales) = nullptr;
  Status (*attr_set_post_ops)(void* attr, const void* post_ops) = nullptr;
  Status (*post_ops_create)(void** post_ops) = nullptr;
  Status (*post_ops_destroy)(void* post_ops) = nullptr;
  Status (*post_ops_append_sum)(void* post_ops, float scale) = nullptr;
  Status (*primitive_desc_create)(void** pd, const void* op_desc, const void* attr, void* engine,
                                  const void* hint) = nullptr;
  Status (*primitive_desc_destroy)(void* pd) = nullptr;
  const MemoryDesc* (*primitive_desc_query_md)(const void* pd, int what, int index) = nullptr;
  size_t (*memory_desc_get_size)(const MemoryDesc*) = nullptr;
  // oneDNN's OpenMP runtime sizes per-thread buffers by omp_get_max_threads()
  // of the thread that creates the primitive.
  int (*omp_get_max_threads)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
  void* engine = nullptr;
  std::string problem;  // why the rule is off; empty when usable
};

template <typename F>
bool find(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

Api load() {
  Api a;
  const Version* (*version)() = nullptr;
  if (!find(version, "dnnl_version")) {
    a.problem = "LibTorch's oneDNN (libdnnl) is not visible to dlsym";
    return a;
  }
  const Version* v = version();
  if (v->major != 2) {
    a.problem = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                ": this rule speaks oneDNN 2.x's C API";
    return a;
  }
  const bool all = find(a.engine_create, "dnnl_engine_create") &&
                   find(a.memory_desc_init_by_strides, "dnnl_memory_desc_init_by_strides") &&
                   find(a.matmul_desc_init, "dnnl_matmul_desc_init") &&
                   find(a.attr_create, "dnnl_primitive_attr_create") &&
                   find(a.attr_destroy, "dnnl_primitive_attr_destroy") &&
                   find(a.attr_set_scratchpad_mode, "dnnl_primitive_attr_set_scratchpad_mode") &&
                   find(a.attr_set_output_scales, "dnnl_primitive_attr_set_output_scales") &&
                   find(a.attr_set_post_ops, "dnnl_primitive_attr_set_post_ops") &&
                   find(a.post_ops_create, "dnnl_post_ops_create") &&
                   find(a.post_ops_destroy, "dnnl_post_ops_destroy") &&
                   find(a.post_ops_append_sum, "dnnl_post_ops_append_sum") &&
                   find(a.primitive_desc_create, "dnnl_primitive_desc_create") &&
                   find(a.primitive_desc_destroy, "dnnl_primitive_desc_destroy") &&
                   find(a.primitive_desc_query_md, "dnnl_primitive_desc_query_md") &&
                   find(a.memory_desc_get_size, "dnnl_memory_desc_get_size");
  if (!all) {
    a.problem = "oneDNN's C API is incomplete in this process";
    return a;
  }
  if (v->cpu_runtime == kRuntimeOmp &&
      !(find(a.omp_get_max_threads, "omp_get_max_threads") && find(a.omp_set_num_threads, "omp_set_num_threads"))) {
    a.problem = "oneDNN uses OpenMP but omp_set_num_threads is not visible";
    return a;
  }
  if (a.engine_create(&a.engine, kCpuEngine, 0) != 0) a.problem = "no oneDNN CPU engine";
  return a;
}

const Api& api() {
  static const Api a = load();
  return a;
}

// A matrix operand as ideep describes it to oneDNN: bf16, sizes and strides.
struct Operand {
  int ndims = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

Operand operand(std::initializer_list<int64_t> dims, std::initializer_list<int64_t> strides) {
  Operand o;
  o.ndims = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), o.dims);
  std::copy(strides.begin(), strides.end(), o.strides);
  return o;
}

// Bytes of the scratchpad oneDNN books for dst = alpha·(src × weights)
// (+ beta·dst when beta ≠ 0) with `threads` threads: the primitive
// descriptor ideep's matmul_forward::compute creates (scratchpad mode user;
// alpha ≠ 1 an output scale, beta ≠ 0 a sum post-op of scale beta). Cached:
// a step repeats the same few shapes.
int64_t matmul_scratchpad_bytes(const Operand& src, const Operand& weights, const Operand& dst, float alpha,
                                float beta, int threads) {
  const Api& a = api();
  if (!a.problem.empty()) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      spdlog::warn("CPU bf16 matmul scratchpads are not predicted ({}): bf16 peaks will be predicted low", a.problem);
    });
    return 0;
  }
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return static_cast<int64_t>(u);
  };
  std::vector<int64_t> key = {threads, bits(alpha), bits(beta)};
  for (const Operand* o : {&src, &weights, &dst}) {
    key.push_back(o->ndims);
    key.insert(key.end(), o->dims, o->dims + o->ndims);
    key.insert(key.end(), o->strides, o->strides + o->ndims);
  }
  static std::mutex mu;
  static std::map<std::vector<int64_t>, int64_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;

  auto md = std::make_unique<MemoryDesc[]>(3);
  auto desc = std::make_unique<MatmulDesc>();
  const Operand* ops[3] = {&src, &weights, &dst};
  bool ok = true;
  for (int i = 0; i < 3; ++i)
    ok = ok && a.memory_desc_init_by_strides(&md[i], ops[i]->ndims, ops[i]->dims, kBf16, ops[i]->strides) == 0;
  ok = ok && a.matmul_desc_init(desc.get(), &md[0], &md[1], nullptr, &md[2]) == 0;
  if (!ok) {  // LibTorch would hit the same refusal at run time
    spdlog::warn("oneDNN rejects a bf16 matmul of {} dims; its scratchpad is not predicted", src.ndims);
    return 0;
  }
  void* attr = nullptr;
  a.attr_create(&attr);
  a.attr_set_scratchpad_mode(attr, kScratchpadUser);
  if (alpha != 1.0f) a.attr_set_output_scales(attr, 1, 0, &alpha);
  if (beta != 0.0f) {
    void* post_ops = nullptr;
    a.post_ops_create(&post_ops);
    a.post_ops_append_sum(post_ops, beta);
    a.attr_set_post_ops(attr, post_ops);
    a.post_ops_destroy(post_ops);
  }
  const int saved_threads = a.omp_get_max_threads ? a.omp_get_max_threads() : 0;
  if (a.omp_set_num_threads) a.omp_set_num_threads(threads);
  void* pd = nullptr;
  const Status st = a.primitive_desc_create(&pd, desc.get(), attr, a.engine, nullptr);
  if (a.omp_set_num_threads) a.omp_set_num_threads(saved_threads);
  a.attr_destroy(attr);
  if (st != 0) {
    spdlog::warn("oneDNN has no bf16 matmul for a {}-dim product (status {}); its scratchpad is not predicted",
                 src.ndims, st);
    return 0;
  }
  const MemoryDesc* scratch = a.primitive_desc_query_md(pd, kQueryScratchpadMd, 0);
  const int64_t bytes = scratch ? static_cast<int64_t>(a.memory_desc_get_size(scratch)) : 0;
  a.primitive_desc_destroy(pd);
  cache.emplace(std::move(key), bytes);
  return bytes;
}

}  // namespace onednn

// mkldnn_bf16_device_check() (ATen/native/mkldnn/Utils.h) on x86, and the
// user switch torch.backends.mkldnn.enabled: together they decide whether a
// bf16 matmul goes to oneDNN at all.
bool cpu_bf16_matmuls_use_onednn() {
  static const bool avx512 =
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return avx512 && at::globalContext().userEnabledMkldnn();
}

int64_t contiguous_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// mm / addmm: addmm_impl_cpu_ (aten/src/ATen/native/LinearAlgebra.cpp) casts
// the fresh row-major result [M, N] as a column-major BLAS C, so it computes
// result^T = m2^T · m1^T: gemm(m = N, n = M, k = K) with a = m2 and b = m1,
// each used as it lies or transposed when its strides allow, else copied
// contiguous first (a copy that lives until the op returns). cpublas::gemm
// normalises degenerate leading dimensions and offers bf16 to
// mkldnn_bf16_gemm, which takes it when m·n·k > 16³ and alpha ≠ 0 and hands
// oneDNN C^T = B^T·A^T: src = b as [n, k], weights = a as [k, m], dst = c as
// [n, m].
void mm_temporaries(const at::Tensor& m1, const at::Tensor& m2, float alpha, float beta, int threads,
                    std::vector<int64_t>* out) {
  const int64_t M = m1.size(0), K = m1.size(1), N = m2.size(1);
  if (M == 0 || N == 0 || K == 0) return;  // no gemm: zeros or a copy of self
  struct Mat {
    int64_t size[2], stride[2];
    int64_t numel() const { return size[0] * size[1]; }
  };
  // The result is the op's fresh contiguous output, so addmm_impl_cpu_
  // takes it as a transposed C (strides {N, 1}) unless it is one column
  // (strides {1, 1}, already column-major).
  const bool transpose_c = N != 1;
  const int64_t ldc_c = transpose_c ? N : 1;  // the result's stride along what BLAS calls columns
  Mat a = {{m1.size(0), m1.size(1)}, {m1.stride(0), m1.stride(1)}};
  Mat b = {{m2.size(0), m2.size(1)}, {m2.stride(0), m2.stride(1)}};
  if (transpose_c) std::swap(a, b);
  const int64_t m = transpose_c ? N : M, n = transpose_c ? M : N, k = a.size[transpose_c ? 0 : 1];
  const int lead = transpose_c ? 1 : 0, other = transpose_c ? 0 : 1;
  auto cast = [&](Mat& x, int64_t rows_needed, int64_t cols_needed) {
    if (x.stride[lead] == 1 && x.stride[other] >= std::max<int64_t>(1, rows_needed)) return false;
    if (x.stride[other] == 1 && x.stride[lead] >= std::max<int64_t>(1, cols_needed)) return true;
    out->push_back(x.numel() * 2);  // .clone(Contiguous), bf16
    x.stride[0] = std::max<int64_t>(x.size[1], 1);
    x.stride[1] = 1;
    return !transpose_c;
  };
  const bool ta = cast(a, m, k);
  const bool tb = cast(b, k, n);
  int64_t lda = a.stride[ta == transpose_c ? 1 : 0];
  int64_t ldb = b.stride[tb == transpose_c ? 1 : 0];
  int64_t ldc = ldc_c;
  // cpublas::internal::normalize_last_dims
  if (n == 1) ldc = m;
  if (ta) {
    if (m == 1) lda = k;
  } else if (k == 1) {
    lda = m;
  }
  if (tb) {
    if (k == 1) ldb = n;
  } else if (n == 1) {
    ldb = k;
  }
  if (!cpu_bf16_matmuls_use_onednn() || m * n * k <= 16 * 16 * 16 || alpha == 0.0f) return;
  const auto src = tb ? onednn::operand({n, k}, {1, ldb}) : onednn::operand({n, k}, {ldb, 1});
  const auto weights = ta ? onednn::operand({k, m}, {1, lda}) : onednn::operand({k, m}, {lda, 1});
  const auto dst = onednn::operand({n, m}, {ldc, 1});
  out->push_back(onednn::matmul_scratchpad_bytes(src, weights, dst, alpha, beta, threads));
}

// bmm / baddbmm: bmm_out_or_baddbmm_ (LinearAlgebra.cpp) sends bf16 to
// mkldnn_matmul when use_mkldnn_bf16_matmul holds (non-empty, B·M·K·N > 16³).
// mkldnn_matmul copies an operand contiguous unless it is contiguous or
// transposed in its last two dims, then hands oneDNN the tensors as they
// lie: src = batch1 [B, M, K], weights = batch2 [B, K, N], dst = the fresh
// contiguous result [B, M, N].
void bmm_temporaries(const at::Tensor& b1, const at::Tensor& b2, float alpha, float beta, int threads,
                     std::vector<int64_t>* out) {
  if (!cpu_bf16_matmuls_use_onednn() || b1.numel() == 0 || b2.numel() == 0) return;
  const int64_t B = b1.size(0), M = b1.size(1), K = b1.size(2), N = b2.size(2);
  if (B * M * K * N <= 16 * 16 * 16 || alpha == 0.0f) return;
  auto as_onednn_takes_it = [&](const at::Tensor& t) {
    const auto s = t.sizes();
    const auto st = t.strides();
    const bool optimized = t.is_contiguous() || (st[0] == s[1] * s[2] && st[1] == 1 && st[2] == s[1]);
    if (optimized) return onednn::operand({s[0], s[1], s[2]}, {st[0], st[1], st[2]});
    out->push_back(contiguous_bytes(t));  // .contiguous()
    return onednn::operand({s[0], s[1], s[2]}, {s[1] * s[2], s[2], 1});
  };
  const auto src = as_onednn_takes_it(b1);
  const auto weights = as_onednn_takes_it(b2);
  const auto dst = onednn::operand({B, M, N}, {M * N, N, 1});
  out->push_back(onednn::matmul_scratchpad_bytes(src, weights, dst, alpha, beta, threads));
}
#endif  // TORCH_VERSION_MAJOR < 2

}  // namespace

void set_meta_kernels_target_cuda(bool cuda) { g_target_cuda = cuda; }

std::vector<int64_t> cpu_bf16_matmul_temporaries(const char* op, c10::ArrayRef<const c10::IValue> in,
                                                 int threads) {
#if TORCH_VERSION_MAJOR >= 2
  return probe_cpu_bf16_matmul(op, in, threads);
#else
  std::vector<int64_t> out;
  auto bf16 = [&](size_t i) {
    return in.size() > i && in[i].isTensor() && in[i].toTensor().scalar_type() == at::kBFloat16;
  };
  auto scalar = [&](size_t i) { return in.size() > i && in[i].isScalar() ? in[i].toScalar().to<float>() : 1.0f; };
  // Schemas: mm(self, mat2), bmm(self, mat2), addmm(self, mat1, mat2, beta, alpha),
  // baddbmm(self, batch1, batch2, beta, alpha); mm and bmm are beta 0, alpha 1.
  if (std::strcmp(op, "aten::mm") == 0 && bf16(0) && bf16(1))
    mm_temporaries(in[0].toTensor(), in[1].toTensor(), 1.0f, 0.0f, threads, &out);
  else if (std::strcmp(op, "aten::addmm") == 0 && bf16(1) && bf16(2))
    mm_temporaries(in[1].toTensor(), in[2].toTensor(), scalar(4), scalar(3), threads, &out);
  else if (std::strcmp(op, "aten::bmm") == 0 && bf16(0) && bf16(1))
    bmm_temporaries(in[0].toTensor(), in[1].toTensor(), 1.0f, 0.0f, threads, &out);
  else if (std::strcmp(op, "aten::baddbmm") == 0 && bf16(1) && bf16(2))
    bmm_temporaries(in[1].toTensor(), in[2].toTensor(), scalar(4), scalar(3), threads, &out);
  return out;
#endif
}

// torch.optim.AdamW(foreach=True)'s ops (optim/adamw.py
// _multi_tensor_adamw, 1.13), which 1.13 has no meta kernels for: the
// in-place ones allocate nothing; _foreach_sqrt and _foreach_add.Scalar
// return one new tensor per input, as their CPU and CUDA kernels do, all
// alive together. On a CPU target, what 1.13's CPU kernels (the "slow"
// per-tensor loops) also hold for an instant: _foreach_mul_.Scalar,
// _foreach_div_.ScalarList and _foreach_add.Scalar each make a 12-byte
// allocation per call, whatever the list's length (measured with
// pytorch/shardfit_meter.py: a call's peak 12 bytes above its outputs for 1,
// 3 and 5 tensors), alive while the outputs are made.
at::Tensor cpu_foreach_transient() {
  return g_target_cuda ? at::Tensor() : at::empty({3}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}
void meta_foreach_mul_scalar_(at::TensorList, const at::Scalar&) { (void)cpu_foreach_transient(); }
void meta_foreach_list_alpha_(at::TensorList, at::TensorList, const at::Scalar&) {}
void meta_foreach_pointwise_scalar_(at::TensorList, at::TensorList, at::TensorList, const at::Scalar&) {}
void meta_foreach_div_scalar_list_(at::TensorList, at::ArrayRef<at::Scalar>) { (void)cpu_foreach_transient(); }
void meta_foreach_pointwise_scalar_list_(at::TensorList, at::TensorList, at::TensorList, at::ArrayRef<at::Scalar>) {}
std::vector<at::Tensor> meta_foreach_new(at::TensorList self) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : self) out.push_back(at::empty_like(t));
  return out;
}
std::vector<at::Tensor> meta_foreach_add_scalar(at::TensorList self, const at::Scalar&) {
  const at::Tensor transient = cpu_foreach_transient();
  return meta_foreach_new(self);
}
// _foreach_add_(tensors, scalar): torch.optim.AdamW(fused=True)'s step
// count, on tensors on the parameters' device (optim/adam.py _fused_adam,
// 2.11). CUDA's kernel adds in place with the scalar as an argument
// (ForeachBinaryOpScalar.cu): nothing allocated. The CPU's is the slow
// per-tensor loop (ForeachOpsKernels.cpp), each add_ wrapping the scalar in
// a tensor (int64 or double, 8 bytes) which TensorIterator then casts to the
// tensor's dtype (a copy of one element): both freed before the next tensor
// (measured with pytorch/shardfit_meter.py on 2.11: 8, then 4, per float32
// step count).
void meta_foreach_add_scalar_(at::TensorList self, const at::Scalar& scalar) {
  if (g_target_cuda) return;
  const auto options = at::TensorOptions().device(at::kMeta);
  for (const at::Tensor& t : self) {
    const at::ScalarType wrapped = scalar.isIntegral(false) ? at::kLong : at::kDouble;
    const at::Tensor number = at::empty({}, options.dtype(wrapped));
    const at::Tensor cast = wrapped == t.scalar_type() ? at::Tensor() : at::empty({}, options.dtype(t.scalar_type()));
  }
}

#if TORCH_VERSION_MAJOR >= 2
// resize_ on kMeta. A real device grows a storage by allocating a buffer of
// the new size, copying, and freeing the old one (CPU: resize_bytes_cpu,
// aten/src/ATen/native/Resize.cpp, the same in 1.13 and 2.11); 1.13's meta
// resize_ did the same through the meta allocator, so the trace saw the
// allocation. LibTorch 2.x's meta resize_ only sets the storage's byte count
// (maybe_resize_storage_meta), and every output an op grows by resizing
// (arange's positions, the out= forms) went unrecorded: a GPT-2 plan on 2.11
// was seq x 8 bytes low from its first forward. This kernel allocates as the
// real devices do.
const at::Tensor& meta_resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  impl->set_sizes_contiguous(sizes);
  const at::MemoryFormat format = memory_format.value_or(at::MemoryFormat::Contiguous);
  if (format != at::MemoryFormat::Contiguous && format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(format);
  if (self.numel() == 0) return self;
  const int64_t needed = static_cast<int64_t>(at::detail::computeStorageNbytes(
      sizes, impl->strides(), self.dtype().itemsize(), impl->storage_offset()));
  c10::Storage storage = self.storage();
  if (needed > static_cast<int64_t>(storage.nbytes())) {
    c10::Allocator* allocator = storage.allocator() ? storage.allocator() : c10::GetAllocator(at::kMeta);
    storage.set_data_ptr_noswap(allocator->allocate(static_cast<size_t>(needed)));  // then the old one goes
    storage.set_nbytes(static_cast<size_t>(needed));
  }
  return self;
}
#endif

void register_meta_kernels(bool override_existing) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<torch::Library>> libs;
  static bool registered_missing = false, overridden = false;
  std::lock_guard<std::mutex> lock(mu);
  if (overridden || (registered_missing && !override_existing)) return;
  // Replacing a kernel makes the dispatcher log a warning per op through
  // glog (Debian's LibTorch logs with it): expected when overriding, so
  // glog's FLAGS_minloglevel (found by its symbol; absent: nothing quieted)
  // is raised to ERROR for the registration.
  int* glog_min_level = override_existing ? static_cast<int*>(dlsym(RTLD_DEFAULT, "_ZN3fLI17FLAGS_minloglevelE")) : nullptr;
  const int saved_level = glog_min_level ? *glog_min_level : 0;
  if (glog_min_level) *glog_min_level = 2;
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__,
                                              __LINE__);
  auto wanted = [&](const char* name) { return override_existing || !has_meta_kernel(name, ""); };
  if (wanted("aten::index_select")) lib->impl("index_select", TORCH_FN(meta_index_select));
  if (wanted("aten::native_layer_norm")) lib->impl("native_layer_norm", TORCH_FN(meta_native_layer_norm));
  if (wanted("aten::native_layer_norm_backward"))
    lib->impl("native_layer_norm_backward", TORCH_FN(meta_native_layer_norm_backward));
  if (wanted("aten::native_dropout")) lib->impl("native_dropout", TORCH_FN(meta_native_dropout));
  if (wanted("aten::native_dropout_backward"))
    lib->impl("native_dropout_backward", TORCH_FN(meta_native_dropout_backward));
  if (wanted("aten::embedding_dense_backward"))
    lib->impl("embedding_dense_backward", TORCH_FN(meta_embedding_dense_backward));
#if TORCH_VERSION_MAJOR >= 2
  // Always: 2.x has a meta resize_, the one that allocates nothing.
  lib->impl("resize_", TORCH_FN(meta_resize_));
#endif
  auto overload_wanted = [&](const char* name, const char* overload) {
    return override_existing || !has_meta_kernel(name, overload);
  };
  if (overload_wanted("aten::_foreach_mul_", "Scalar")) lib->impl("_foreach_mul_.Scalar", TORCH_FN(meta_foreach_mul_scalar_));
  if (overload_wanted("aten::_foreach_add_", "List")) lib->impl("_foreach_add_.List", TORCH_FN(meta_foreach_list_alpha_));
  if (overload_wanted("aten::_foreach_addcmul_", "Scalar"))
    lib->impl("_foreach_addcmul_.Scalar", TORCH_FN(meta_foreach_pointwise_scalar_));
  if (overload_wanted("aten::_foreach_div_", "ScalarList"))
    lib->impl("_foreach_div_.ScalarList", TORCH_FN(meta_foreach_div_scalar_list_));
  if (overload_wanted("aten::_foreach_addcdiv_", "ScalarList"))
    lib->impl("_foreach_addcdiv_.ScalarList", TORCH_FN(meta_foreach_pointwise_scalar_list_));
  if (overload_wanted("aten::_foreach_sqrt", "")) lib->impl("_foreach_sqrt", TORCH_FN(meta_foreach_new));
  if (overload_wanted("aten::_foreach_add", "Scalar")) lib->impl("_foreach_add.Scalar", TORCH_FN(meta_foreach_add_scalar));
  if (overload_wanted("aten::_foreach_add_", "Scalar"))
    lib->impl("_foreach_add_.Scalar", TORCH_FN(meta_foreach_add_scalar_));
  if (glog_min_level) *glog_min_level = saved_level;
  libs.push_back(std::move(lib));
  registered_missing = true;
  overridden = override_existing;
}

void register_missing_meta_kernels() { register_meta_kernels(/*override_existing=*/false); }

}  // namespace shardfit::planner
