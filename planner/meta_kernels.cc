// Meta kernels for the ops LibTorch 1.13 has none for. A meta kernel only
// computes output shapes and dtypes and allocates the outputs on kMeta, so
// the recording allocator sees exactly the storages the real kernel returns.
#include <memory>
#include <mutex>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "planner/trace.h"

namespace shardfit::planner {
namespace {

// Set by trace_step: imitate CUDA's allocation choices (fp32 LayerNorm
// statistics for 2-byte inputs) or the CPU's (statistics in the input dtype).
bool g_target_cuda = true;

at::Tensor meta_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (dim < 0) dim += self.dim();
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_native_layer_norm(
    const at::Tensor& input, c10::IntArrayRef normalized_shape, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, double) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  auto stat_dtype = input.scalar_type();
  if (g_target_cuda && (stat_dtype == at::kHalf || stat_dtype == at::kBFloat16)) stat_dtype = at::kFloat;
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
  if (g_target_cuda) {  // one fused kernel: output, then the byte mask
    auto out = at::empty(input.sizes(), input.options());
    return {out, at::empty(input.sizes(), input.options().dtype(at::kBool))};
  }
  // CPU (1.13 native_dropout_cpu): the byte mask, a bernoulli noise tensor in
  // the input's dtype, the output = input * noise * scale; the noise is freed
  // on return. Measured: the meter sees exactly this sequence.
  auto mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
  auto noise = at::empty(input.sizes(), input.options());
  auto out = at::empty(input.sizes(), input.options());
  return {out, mask};
}

at::Tensor meta_native_dropout_backward(const at::Tensor& grad, const at::Tensor&, double) {
  return at::empty(grad.sizes(), grad.options());
}

at::Tensor meta_embedding_dense_backward(const at::Tensor& grad, const at::Tensor&,
                                         int64_t num_weights, int64_t, bool) {
  return at::empty({num_weights, grad.size(-1)}, grad.options());
}

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void set_meta_kernels_target_cuda(bool cuda) { g_target_cuda = cuda; }

void register_missing_meta_kernels() {
  static std::once_flag once;
  static std::unique_ptr<torch::Library> lib;
  std::call_once(once, [] {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                           __FILE__, __LINE__);
    if (!has_meta_kernel("aten::index_select", ""))
      lib->impl("index_select", TORCH_FN(meta_index_select));
    if (!has_meta_kernel("aten::native_layer_norm", ""))
      lib->impl("native_layer_norm", TORCH_FN(meta_native_layer_norm));
    if (!has_meta_kernel("aten::native_layer_norm_backward", ""))
      lib->impl("native_layer_norm_backward", TORCH_FN(meta_native_layer_norm_backward));
    if (!has_meta_kernel("aten::native_dropout", ""))
      lib->impl("native_dropout", TORCH_FN(meta_native_dropout));
    if (!has_meta_kernel("aten::native_dropout_backward", ""))
      lib->impl("native_dropout_backward", TORCH_FN(meta_native_dropout_backward));
    if (!has_meta_kernel("aten::embedding_dense_backward", ""))
      lib->impl("embedding_dense_backward", TORCH_FN(meta_embedding_dense_backward));
  });
}

}  // namespace shardfit::planner
