// `--attention flash` (models/attention.h): the allocations the planner's
// trace makes for PyTorch's flash kernel, each checked against the sizes
// flash_api.cpp's mha_fwd / mha_bwd allocate; the split-KV heuristic; what
// flash buys a plan; and the settings it is refused for. `--attention sdpa`:
// the kernel it resolves to per device and precision, and the memory-
// efficient kernel's allocations (attention.cu, attention_backward.cu).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "models/attention.h"
#include "models/model_config.h"
#include "planner/plan_builder.h"
#include "planner/trace.h"

namespace shardfit {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

TEST(FlashAttention, SplitKvHeuristicFollowsFlashApi) {
  // Enough (batch x heads x 64-row blocks) to fill 80% of 2 x 132 slots: no split.
  EXPECT_EQ(models::flash_num_splits(2, 12, 1024, 1024, 64, 132), 1);
  // 192 blocks of work, 4 key blocks of 256: splits 1, 2 and 4 are eligible
  // (3 gives the same 2 blocks per split as 2); 4 fills 97% of the last wave.
  EXPECT_EQ(models::flash_num_splits(1, 12, 1024, 1024, 64, 132), 4);
  // One key block: nothing to split.
  EXPECT_EQ(models::flash_num_splits(1, 12, 128, 128, 64, 132), 1);
  // No SM count: no split.
  EXPECT_EQ(models::flash_num_splits(1, 12, 1024, 1024, 64, 0), 1);
}

// The bytes of every allocation made inside the attention module itself (not
// its projections) by an aten::empty* op, by phase.
std::map<planner::Phase, std::vector<int64_t>> flash_allocs(const planner::ModelTrace& t, int attn) {
  std::map<planner::Phase, std::vector<int64_t>> out;
  for (const auto& e : t.events) {
    if (e.kind != planner::MemEvent::kAlloc || e.module != attn || e.op < 0) continue;
    if (t.op_names[e.op].rfind("aten::empty", 0) == 0) out[e.phase].push_back(e.bytes);
  }
  return out;
}

// Whether `run` appears in `all` as consecutive elements (the attention
// module also allocates around the kernel: rotary embeddings, dropout).
bool has_run(const std::vector<int64_t>& all, const std::vector<int64_t>& run) {
  return std::search(all.begin(), all.end(), run.begin(), run.end()) != all.end();
}

int module_index(const planner::ModelTrace& t, const std::string& path) {
  for (size_t i = 0; i < t.modules.size(); ++i)
    if (t.modules[i].path == path) return static_cast<int>(i);
  return -1;
}

TEST(FlashAttention, TraceAllocatesWhatTheKernelAllocates) {
  planner::TraceOptions o;
  o.batch = 2;
  o.seq_len = 64;
  o.dtype = planner::DType::kF16;
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    auto cfg = models::resolve_model(name);
    models::set_attention(&cfg, "flash");
    cfg.flash_sm_count = 132;
    const auto t = planner::trace_step(cfg, o);
    const bool llama = cfg.family == models::Family::kLlama;
    const int attn = module_index(t, llama ? "model.layers.0.self_attn" : "transformer.h.0.attn");
    ASSERT_GE(attn, 0);
    const int64_t b = o.batch, s = o.seq_len, h = cfg.heads;
    const int64_t d = llama ? cfg.head_dim_or_default() : cfg.hidden / cfg.heads;
    ASSERT_EQ(models::flash_num_splits(b, h, s, s, d, 132), 1) << "this case has no split-KV buffers";
    const int64_t qkv = b * s * h * d * 2;  // fp16
    auto allocs = flash_allocs(t, attn);
    // mha_fwd: out, softmax_lse [b, h, s] fp32, rng_state (2 words), the unused
    // offset (1 word); with dropout (gpt2's attn_pdrop) the rng state again.
    std::vector<int64_t> fwd = {qkv, b * h * s * 4, 16, 8};
    if (!llama) fwd.push_back(16);
    EXPECT_TRUE(has_run(allocs[planner::Phase::kForward], fwd))
        << testing::PrintToString(allocs[planner::Phase::kForward]);
    // mha_bwd: dq, dk, dv, softmax_d [b, h, s128] fp32, dq_accum [b, s128, h, d32] fp32.
    const std::vector<int64_t> bwd = {qkv, qkv, qkv, b * h * round_up(s, 128) * 4,
                                      b * round_up(s, 128) * h * round_up(d, 32) * 4};
    EXPECT_TRUE(has_run(allocs[planner::Phase::kBackward], bwd))
        << testing::PrintToString(allocs[planner::Phase::kBackward]);
  }
}

TEST(FlashAttention, RefusedWhereTheKernelCannotRun) {
  auto bert = models::resolve_model("bert-tiny");
  EXPECT_THROW(models::set_attention(&bert, "flash"), std::invalid_argument);
  auto llama = models::resolve_model("llama-tiny");
  EXPECT_THROW(models::set_attention(&llama, "math"), std::invalid_argument);
  models::set_attention(&llama, "flash");
  EXPECT_STREQ(models::attention_name(llama), "flash");
  // fp32 runs another kernel: refused rather than planned as flash.
  planner::TraceOptions o;
  o.batch = 1;
  o.seq_len = 16;
  o.dtype = planner::DType::kF32;
  EXPECT_THROW(planner::trace_step(llama, o), std::invalid_argument);
}

planner::PlanRequest request(const std::string& model, const std::string& attention, const std::string& device,
                             int64_t seq_len) {
  planner::PlanRequest r;
  r.model = models::resolve_model(model);
  models::set_attention(&r.model, attention);
  r.seq_len = seq_len;
  r.gpus_per_node = 8;
  r.profile = planner::load_profile(device, std::string(SHARDFIT_SOURCE_DIR) + "/profiles");
  r.candidates.strategies = {"zero3/bf16/wrap=block"};
  return r;
}

TEST(FlashAttention, FitsALargerBatchThanEagerAtLongSequences) {
  const auto eager = planner::build_plan(request("llama-3.2-1b", "eager", "h100-80gb", 4096));
  const auto flash = planner::build_plan(request("llama-3.2-1b", "flash", "h100-80gb", 4096));
  ASSERT_EQ(eager.candidates.size(), 1u);
  ASSERT_EQ(flash.candidates.size(), 1u);
  EXPECT_EQ(flash.model.attention, "flash");
  // Eager keeps 32 heads x 4096^2 probabilities per layer; flash does not.
  EXPECT_EQ(eager.candidates[0].max_batch_per_gpu, 1);
  EXPECT_GT(flash.candidates[0].max_batch_per_gpu, 2 * eager.candidates[0].max_batch_per_gpu);
  // A max batch of 1 still computes: 6 x 1.24e9 parameters x 4096 tokens at
  // most 989 TFLOP/s is at least 30 ms (batch 1's trace records no FLOPs of
  // its own; they come from batches 2 and 3).
  EXPECT_GT(eager.candidates[0].predicted.compute_s, 0.03);
}

TEST(SdpaAttention, ResolvesToTheKernelPytorchPicks) {
  auto llama = models::resolve_model("llama-tiny");
  models::set_attention(&llama, "sdpa");
  EXPECT_STREQ(models::attention_name(llama), "sdpa");
  auto name = [](const models::ModelConfig& c, bool cuda, double cc, bool half) {
    return std::string(models::attention_name(models::resolve_sdpa(c, cuda, cc, half)));
  };
  EXPECT_EQ(name(llama, true, 9.0, true), "cudnn");   // Hopper: 2.11 puts cuDNN's kernel first
  EXPECT_EQ(name(llama, true, 10.0, true), "cudnn");  // and on compute capability 10.0
  EXPECT_EQ(name(llama, true, 8.9, true), "flash");
  EXPECT_EQ(name(llama, true, 8.0, true), "flash");
  EXPECT_EQ(name(llama, true, 9.0, false), "efficient");  // fp32: neither cuDNN's nor flash takes it
  EXPECT_EQ(name(llama, true, 8.0, false), "efficient");
  EXPECT_EQ(name(llama, true, 7.0, true), "efficient");   // below Ampere: no flash kernel
  EXPECT_EQ(name(llama, false, 0, false), "eager");       // a CPU: what shardfit's CPU engine runs
  auto bert = models::resolve_model("bert-tiny");
  models::set_attention(&bert, "sdpa");  // its padding mask: eager everywhere
  EXPECT_EQ(name(bert, true, 9.0, true), "eager");
  auto eager = models::resolve_model("llama-tiny");
  EXPECT_EQ(name(eager, true, 9.0, true), "eager");  // not sdpa: unchanged
}

TEST(SdpaAttention, EfficientKernelTraceAllocatesWhatTheKernelAllocates) {
  planner::TraceOptions o;
  o.batch = 2;
  o.seq_len = 40;  // not a multiple of 32: the log-sum-exp is padded
  o.dtype = planner::DType::kF32;
  o.target_cuda = true;
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    auto cfg = models::resolve_model(name);
    models::set_attention(&cfg, "sdpa");
    cfg = models::resolve_sdpa(cfg, true, 8.0, false);
    ASSERT_TRUE(cfg.efficient_attention);
    const auto t = planner::trace_step(cfg, o);
    const bool llama = cfg.family == models::Family::kLlama;
    const int attn = module_index(t, llama ? "model.layers.0.self_attn" : "transformer.h.0.attn");
    ASSERT_GE(attn, 0);
    const int64_t b = o.batch, s = o.seq_len, h = cfg.heads;
    const int64_t d = llama ? cfg.head_dim_or_default() : cfg.hidden / cfg.heads;
    const int64_t qkv = b * s * h * d * 4;  // fp32
    auto allocs = flash_allocs(t, attn);
    // _efficient_attention_forward: res, logsumexp [b, h, ceil(s / 32) * 32] fp32 (seed, offset: CPU scalars).
    EXPECT_TRUE(has_run(allocs[planner::Phase::kForward], {qkv, b * h * round_up(s, 32) * 4}))
        << testing::PrintToString(allocs[planner::Phase::kForward]);
    // _efficient_attention_backward: grad_q, grad_k, grad_v, then the fp32 kernel's delta:
    // grad_out * out, its sum over d, the [b, h, s] copy (every op's allocations, not only empty's).
    std::vector<int64_t> bwd_all;
    std::string ops;
    for (const auto& e : t.events)
      if (e.kind == planner::MemEvent::kAlloc && e.module == attn && e.phase == planner::Phase::kBackward) {
        bwd_all.push_back(e.bytes);
        ops += (e.op >= 0 ? t.op_names[e.op] : std::string("?")) + ":" + std::to_string(e.bytes) + " ";
      }
    const std::vector<int64_t> bwd = {qkv, qkv, qkv, qkv, b * s * h * 4, b * h * s * 4};
    EXPECT_TRUE(has_run(bwd_all, bwd)) << ops;
  }
}

// Every allocation made inside module `attn` in `phase`, in order.
std::vector<int64_t> module_allocs(const planner::ModelTrace& t, int attn, planner::Phase phase) {
  std::vector<int64_t> out;
  for (const auto& e : t.events)
    if (e.kind == planner::MemEvent::kAlloc && e.module == attn && e.phase == phase) out.push_back(e.bytes);
  return out;
}

planner::ModelTrace trace_of(const models::ModelConfig& cfg, int64_t batch, int64_t seq_len, planner::DType dtype) {
  planner::TraceOptions o;
  o.batch = batch;
  o.seq_len = seq_len;
  o.dtype = dtype;
  return planner::trace_step(cfg, o);
}

TEST(CudnnAttention, TraceAllocatesWhatTheH200Recorded) {
  // The attention shape of the card's recording
  // (reports/gpu/history/20261204T114826Z-row11.json.gz: Llama-3.2-1B, bf16,
  // batch 1, seq 4096, 32 query heads of 64), one layer.
  auto cfg = models::resolve_model("llama-3.2-1b");
  cfg.layers = 1;
  models::set_attention(&cfg, "sdpa");
  cfg = models::resolve_sdpa(cfg, true, 9.0, true);
  ASSERT_TRUE(cfg.cudnn_attention);
  const auto t = trace_of(cfg, 1, 4096, planner::DType::kBF16);
  const int attn = module_index(t, "model.layers.0.self_attn");
  ASSERT_GE(attn, 0);
  // The recording's forward, in every layer: the dropout seed and offset,
  // the output, the log-sum-exp [1, 32, 4096, 1] fp32, the graph's workspace.
  const std::vector<int64_t> fwd = {8, 8, 16777216, 524288, 256};
  const auto fwd_all = module_allocs(t, attn, planner::Phase::kForward);
  EXPECT_TRUE(has_run(fwd_all, fwd)) << testing::PrintToString(fwd_all);
  // Backward: dq, dk, dv with 32 heads each (the engine repeats the 8
  // key/value heads first, as transformers' eager attention does) and one
  // workspace. The card's, for transformers' grouped heads, is 67,633,408
  // bytes: this one and the full-head dK and dV (2 x 16 MiB) that its
  // grouped-query backward reduces from.
  const int64_t workspace = models::cudnn_backward_workspace_bytes(1, 32, 4096, 64);
  EXPECT_EQ(workspace + 2 * 16777216, 67633408);
  const std::vector<int64_t> bwd = {16777216, 16777216, 16777216, workspace};
  const auto bwd_all = module_allocs(t, attn, planner::Phase::kBackward);
  EXPECT_TRUE(has_run(bwd_all, bwd)) << testing::PrintToString(bwd_all);
}

TEST(CudnnAttention, Gpt2KeepsItsOutputLayoutAndDropoutAddsNothing) {
  // GPT-2's q is a view into c_attn's output, not dense: the output cuDNN
  // allocates (empty_like(q)) keeps its [b, s, h, d] order all the same, so
  // the model's transpose(1, 2).contiguous() copies nothing, as under flash.
  // Dropout (attn_pdrop) adds nothing to the kernel's own allocations.
  auto flash = models::resolve_model("gpt2-tiny");
  models::set_attention(&flash, "sdpa");
  auto cudnn = models::resolve_sdpa(flash, true, 9.0, true);
  flash = models::resolve_sdpa(flash, true, 8.0, true);
  ASSERT_TRUE(cudnn.cudnn_attention);
  ASSERT_TRUE(flash.flash_attention);
  const int64_t b = 2, s = 64, h = cudnn.heads, d = cudnn.hidden / cudnn.heads;
  const auto t = trace_of(cudnn, b, s, planner::DType::kF16);
  const int attn = module_index(t, "transformer.h.0.attn");
  ASSERT_GE(attn, 0);
  const int64_t qkv = b * h * s * d * 2;
  const auto fwd_all = module_allocs(t, attn, planner::Phase::kForward);
  EXPECT_TRUE(has_run(fwd_all, {8, 8, qkv, b * h * s * 4, 256})) << testing::PrintToString(fwd_all);
  const auto bwd_all = module_allocs(t, attn, planner::Phase::kBackward);
  EXPECT_TRUE(has_run(bwd_all, {qkv, qkv, qkv, models::cudnn_backward_workspace_bytes(b, h, s, d)}))
      << testing::PrintToString(bwd_all);
  const auto f = trace_of(flash, b, s, planner::DType::kF16);
  const auto flash_fwd = module_allocs(f, module_index(f, "transformer.h.0.attn"), planner::Phase::kForward);
  EXPECT_EQ(std::count(fwd_all.begin(), fwd_all.end(), qkv), std::count(flash_fwd.begin(), flash_fwd.end(), qkv));
}

TEST(CudnnAttention, RefusedAboveTheHeadDimensionItIsModelledFor) {
  auto llama = models::resolve_model("llama-tiny");
  llama.head_dim = 2 * models::kCudnnAttentionMaxHeadDim;
  models::set_attention(&llama, "sdpa");
  try {
    models::resolve_sdpa(llama, true, 9.0, true);
    ADD_FAILURE() << "planned cuDNN's attention at head dimension " << llama.head_dim;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--attention sdpa: llama-tiny has head dimension 256"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(models::resolve_sdpa(llama, true, 8.0, true).flash_attention);  // Ampere: flash takes 256
}

TEST(FusedAttention, TheTraceCountsTheKernelsProducts) {
  // Eager attention's four products per layer are bmm's the tracer counts:
  // QK^T and PV forward (2 b h s^2 d FLOPs each), and two per product in
  // backward. A fused kernel runs inside one op; the tracer counts it as
  // FlashAttention-2 does: QK^T and PV forward, five such backward, each
  // over half the rows under the causal mask. So per layer eager counts
  // 2 b h s^2 d more forward and 3 b h s^2 d more backward.
  struct Kernel {
    double cc;
    planner::DType dtype;
  };
  for (const Kernel& k : {Kernel{8.0, planner::DType::kF16}, Kernel{9.0, planner::DType::kBF16},
                          Kernel{8.0, planner::DType::kF32}}) {
    auto cfg = models::resolve_model("llama-tiny");
    const auto eager = trace_of(cfg, 2, 64, k.dtype);
    models::set_attention(&cfg, "sdpa");
    cfg = models::resolve_sdpa(cfg, true, k.cc, k.dtype != planner::DType::kF32);
    SCOPED_TRACE(models::attention_name(cfg));
    ASSERT_TRUE(models::fused_attention(cfg));
    const auto fused = trace_of(cfg, 2, 64, k.dtype);
    const double per_layer = 2.0 * cfg.heads * 64 * 64 * cfg.head_dim_or_default();  // b h s^2 d, b = 2
    EXPECT_DOUBLE_EQ(eager.forward_flops - fused.forward_flops, cfg.layers * 2 * per_layer);
    EXPECT_DOUBLE_EQ(eager.backward_flops - fused.backward_flops, cfg.layers * 3 * per_layer);
  }
}

TEST(SdpaAttention, PlanRecordsEachCandidatesKernel) {
  auto kernels = [](const std::string& device) {
    planner::PlanRequest r = request("llama-tiny", "sdpa", device, 64);
    r.gpus_per_node = 2;
    r.candidates.strategies = {"ddp"};
    r.candidates.precisions = {"all"};
    // A CPU has no memory figure of its own, and its bf16 candidates need one.
    if (device == "cpu") r.device_mem_bytes = int64_t{64} << 20;
    const planner::Plan plan = planner::build_plan(r);
    EXPECT_EQ(plan.model.attention, "sdpa");
    std::map<std::string, std::string> out;
    for (const auto& c : plan.candidates) out[planner::precision_name(c.candidate.precision)] = c.attention;
    return out;
  };
  const auto a100 = kernels("a100-80gb");
  EXPECT_EQ(a100.at("fp32"), "efficient");
  EXPECT_EQ(a100.at("bf16"), "flash");
  EXPECT_EQ(kernels("v100-32gb").at("fp16"), "efficient");
  const auto h100 = kernels("h100-80gb");
  EXPECT_EQ(h100.at("bf16"), "cudnn");
  EXPECT_EQ(h100.at("fp32"), "efficient");
  EXPECT_EQ(kernels("cpu").at("fp32"), "eager");
}

TEST(FlashAttention, PlanRefusesDevicesWithoutTheKernel) {
  for (const char* device : {"titan-rtx-24gb", "v100-32gb", "cpu"}) {
    SCOPED_TRACE(device);
    try {
      planner::build_plan(request("llama-tiny", "flash", device, 64));
      ADD_FAILURE() << "planned flash on " << device;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("compute capability 8.0"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardfit
