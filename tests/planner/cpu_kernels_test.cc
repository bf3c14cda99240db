// The trace against LibTorch's real CPU kernels: inside every bf16 matrix
// product (mm, addmm, bmm, baddbmm) of a training step, the trace for a CPU
// target records the storages the CPU kernel really allocates — its output,
// and on an AVX-512 CPU the oneDNN scratchpad (and any operand copy) that
// ideep takes from LibTorch's CPU allocator for the length of the call.
// Without the CPU rule in the tracer the trace has only the outputs, and a
// bf16 plan on an AVX-512 CPU is predicted 0.3-3.7% low. On a CPU without
// AVX-512, LibTorch's bf16 products allocate nothing but their outputs, and
// so does the trace: the comparison holds there too.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "models/model.h"
#include "planner/trace.h"
#include "tests/planner/recording_cpu_allocator.h"

namespace shardfit::planner {
namespace {

bool is_matmul(const char* op) {
  for (const char* m : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
    if (std::strcmp(op, m) == 0) return true;
  return false;
}

// Every CPU allocation made while a matrix product runs (the outermost one
// on this thread: an operand copy is a nested clone), as "op bytes", in order.
std::mutex g_mu;
std::vector<std::string> g_cpu_allocs;
bool g_recording = false;
thread_local int t_depth = 0;  // ops running inside the outermost product
thread_local const char* t_product = nullptr;

// RecordingCpuAllocator's observer.
void record_cpu_alloc(size_t nbytes) {
  if (g_recording && t_depth > 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_cpu_allocs.push_back(std::string(t_product) + " " + std::to_string(nbytes));
  }
}

std::unique_ptr<at::ObserverContext> op_begins(const at::RecordFunction& fn) {
  if (t_depth == 0 && is_matmul(fn.name())) t_product = fn.name();
  if (t_depth > 0 || is_matmul(fn.name())) ++t_depth;
  return nullptr;
}
void op_ends(const at::RecordFunction&, at::ObserverContext*) {
  if (t_depth > 0) --t_depth;  // ops nest on a thread: this one began inside the product
}

// One forward + loss + backward of `model` in bf16 on the CPU, as the
// executor's flat gradients make it (every .grad exists, so AccumulateGrad
// adds in place).
std::vector<std::string> cpu_matmul_allocs(const models::ModelConfig& config, int64_t batch, int64_t seq) {
  static RecordingCpuAllocator* recorder = [] {
    auto* r = new RecordingCpuAllocator(c10::GetCPUAllocator(), &record_cpu_alloc);
    c10::SetCPUAllocator(r, /*priority=*/50);
    return r;
  }();
  (void)recorder;
  auto model = models::build_model(config, torch::TensorOptions().dtype(torch::kBFloat16));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  models::Batch b;
  const auto ids = torch::TensorOptions().dtype(torch::kLong);
  b.input_ids = torch::randint(0, config.vocab_size, {batch, seq}, ids);
  if (config.family == models::Family::kBert) {
    b.token_type_ids = torch::zeros({batch, seq}, ids);
    b.attention_mask = torch::ones({batch, seq}, ids);
    b.labels = torch::zeros({batch}, ids);
  }
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&op_begins, &op_ends)
                                                .scopes({at::RecordScope::FUNCTION}));
  g_cpu_allocs.clear();
  g_recording = true;
  model->forward_loss(b).backward();
  g_recording = false;
  at::removeCallback(handle);
  return g_cpu_allocs;
}

// The same from the trace: allocations the tracer attributes to a matrix
// product, with the sizes of the storages it records.
std::vector<std::string> traced_matmul_allocs(const ModelTrace& t) {
  std::vector<std::string> out;
  for (const auto& e : t.events)
    if (e.kind == MemEvent::kAlloc && e.op >= 0 && is_matmul(t.op_names[e.op].c_str()))
      out.push_back(t.op_names[e.op] + " " + std::to_string(e.bytes));
  return out;
}

ModelTrace cpu_bf16_trace(const models::ModelConfig& config, int64_t batch, int64_t seq) {
  TraceOptions o;
  o.batch = batch;
  o.seq_len = seq;
  o.dtype = DType::kBF16;
  o.target_cuda = false;
  o.cpu_threads = at::get_num_threads();  // the threads the CPU run below uses
  return trace_step(config, o);
}

// (model, intra-op threads): oneDNN sizes its scratchpad per thread.
class CpuBf16Matmuls : public ::testing::TestWithParam<std::tuple<const char*, int>> {
 protected:
  void SetUp() override {
    saved_threads_ = at::get_num_threads();
    at::set_num_threads(std::get<1>(GetParam()));
  }
  void TearDown() override { at::set_num_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_P(CpuBf16Matmuls, TraceRecordsWhatTheCpuKernelsAllocate) {
  const char* name = std::get<0>(GetParam());
  const auto config = models::resolve_model(name);
  // Batch 5 x 24 tokens: products small and large enough for both of
  // LibTorch's routes (oneDNN takes m·n·k > 16³), and token counts that are
  // no power of two, so oneDNN's blocking has tails.
  const int64_t batch = 5, seq = 24;
  const std::vector<std::string> cpu = cpu_matmul_allocs(config, batch, seq);
  const ModelTrace t = cpu_bf16_trace(config, batch, seq);
  ASSERT_FALSE(cpu.empty());
  EXPECT_EQ(traced_matmul_allocs(t), cpu);
  // What a trace without the CPU rule records: the products' outputs.
  TraceOptions o;
  o.batch = batch;
  o.seq_len = seq;
  o.dtype = DType::kBF16;
  o.target_cuda = true;
  const size_t outputs = traced_matmul_allocs(trace_step(config, o)).size();
  std::printf("%s, %d threads: %zu allocations inside bf16 matrix products on this CPU, %zu of them outputs\n",
              name, at::get_num_threads(), cpu.size(), outputs);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndThreads, CpuBf16Matmuls,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "bert-tiny"), ::testing::Values(1, 2)));

// CUDA targets keep what they had: a bf16 trace allocates exactly what an
// fp16 one does (the same bytes, no CPU scratchpads).
TEST(CpuBf16MatmulRule, CudaTargetsAreUnchanged) {
  const auto config = models::resolve_model("gpt2-tiny");
  TraceOptions o;
  o.batch = 5;
  o.seq_len = 24;
  o.target_cuda = true;
  o.dtype = DType::kBF16;
  const ModelTrace bf16 = trace_step(config, o);
  o.dtype = DType::kF16;
  const ModelTrace fp16 = trace_step(config, o);
  ASSERT_EQ(bf16.events.size(), fp16.events.size());
  for (size_t i = 0; i < bf16.events.size(); ++i) {
    EXPECT_EQ(bf16.events[i].kind, fp16.events[i].kind) << i;
    EXPECT_EQ(bf16.events[i].bytes, fp16.events[i].bytes) << i;
  }
}

}  // namespace
}  // namespace shardfit::planner
