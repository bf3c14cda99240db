// The tracer the planner builds on, over the built-in models: every
// allocation freed, activations affine in the batch, FLOPs as the formula
// says, checkpointing, the time model's work (affine in the batch, the
// step's own nodes), recordings on several threads at once, bad options.
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model.h"
#include "models/model_config.h"
#include "models/module_table.h"
#include "planner/batch_search.h"
#include "planner/trace.h"

namespace shardfit {
namespace {

const torch::TensorOptions kMetaOpts = torch::TensorOptions().device(torch::kMeta);

planner::ModelTrace trace(const char* name, int64_t batch, std::vector<int> ckpt = {}) {
  planner::TraceOptions o;
  o.batch = batch;
  o.seq_len = 32;
  o.recompute_modules = std::move(ckpt);
  return planner::trace_step(models::resolve_model(name), o);
}

// Highest live bytes over the events (optionally of one phase only, the
// live set still counting everything allocated before).
int64_t peak_bytes(const planner::ModelTrace& t, int phase = -1) {
  std::unordered_map<int64_t, int64_t> live;
  int64_t now = 0, peak = 0;
  for (const auto& e : t.events) {
    if (e.kind == planner::MemEvent::kAlloc) {
      live[e.tensor] = e.bytes;
      now += e.bytes;
    } else if (e.kind == planner::MemEvent::kFree) {
      now -= live.at(e.tensor);
      live.erase(e.tensor);
    } else {
      continue;
    }
    if (phase < 0 || static_cast<int>(e.phase) == phase) peak = std::max(peak, now);
  }
  return peak;
}

void expect_allocs_and_frees_pair(const planner::ModelTrace& t) {
  std::set<int64_t> live, seen;
  int64_t allocs = 0;
  for (const auto& e : t.events) {
    if (e.kind == planner::MemEvent::kAlloc) {
      EXPECT_TRUE(seen.insert(e.tensor).second) << "storage id reused: " << e.tensor;
      EXPECT_GE(e.bytes, 0);
      live.insert(e.tensor);
      ++allocs;
    } else if (e.kind == planner::MemEvent::kFree) {
      EXPECT_EQ(live.erase(e.tensor), 1u) << "free without a live alloc: " << e.tensor;
    }
    EXPECT_GE(e.module, 0);
    EXPECT_LT(e.module, static_cast<int>(t.modules.size()));
  }
  EXPECT_GT(allocs, 50) << t.model_name;
  EXPECT_TRUE(live.empty()) << live.size() << " storages never freed in " << t.model_name;
}

size_t count_events(const planner::ModelTrace& t, planner::MemEvent::Kind kind) {
  size_t n = 0;
  for (const auto& e : t.events) n += e.kind == kind;
  return n;
}

TEST(TraceTest, Gpt2TinyEveryAllocIsFreed) {
  const auto t = trace("gpt2-tiny", 2);
  expect_allocs_and_frees_pair(t);
  EXPECT_EQ(t.param_numel(), models::resolve_model("gpt2-tiny").param_count());
  // Forward begins/ends balance per module, backward likewise.
  std::map<std::pair<int, int>, int> open;  // (phase, module) -> depth
  for (const auto& e : t.events) {
    if (e.kind == planner::MemEvent::kModuleBegin) ++open[{static_cast<int>(e.phase), e.module}];
    if (e.kind == planner::MemEvent::kModuleEnd) --open[{static_cast<int>(e.phase), e.module}];
  }
  for (const auto& [key, depth] : open)
    EXPECT_EQ(depth, 0) << "phase " << key.first << " module " << key.second;
  bool backward_seen = false;
  for (const auto& e : t.events) backward_seen |= e.phase == planner::Phase::kBackward;
  EXPECT_TRUE(backward_seen);
}

// Same event stream (kinds, modules, ops, phases) in both traces, and every
// allocation's size affine in batch across the three: what the planner's
// AffineTrace (batch_search.h) relies on.
void expect_affine(const planner::ModelTrace& a, const planner::ModelTrace& b,
                   const planner::ModelTrace& c) {
  ASSERT_EQ(a.events.size(), b.events.size());
  ASSERT_EQ(b.events.size(), c.events.size());
  ASSERT_EQ(b.batch - a.batch, c.batch - b.batch);
  for (size_t i = 0; i < a.events.size(); ++i) {
    const auto &x = a.events[i], &y = b.events[i], &z = c.events[i];
    ASSERT_EQ(x.kind, y.kind) << "event " << i;
    ASSERT_EQ(y.kind, z.kind) << "event " << i;
    EXPECT_EQ(x.module, z.module) << "event " << i;
    EXPECT_EQ(x.phase, z.phase) << "event " << i;
    ASSERT_EQ(x.op < 0, z.op < 0) << "event " << i;
    if (x.op >= 0) {
      EXPECT_EQ(a.op_names.at(x.op), c.op_names.at(z.op)) << "event " << i;
    }
    EXPECT_EQ(z.bytes - y.bytes, y.bytes - x.bytes) << "event " << i << " not affine in batch";
  }
}

TEST(TraceTest, Gpt2TinyActivationsAreLinearInBatch) {
  const auto t1 = trace("gpt2-tiny", 1), t2 = trace("gpt2-tiny", 2), t3 = trace("gpt2-tiny", 3),
             t4 = trace("gpt2-tiny", 4), t6 = trace("gpt2-tiny", 6);
  // From batch 2 up the same ops run at every batch size: the same events,
  // only sizes differ. (Batch 1 is not on the line: matmul folds a unit
  // batch dimension and some copies become views, so it has fewer events,
  // 392 vs 414 here; the planner traces batch 1 on its own for that reason.)
  expect_affine(t2, t3, t4);
  expect_affine(t2, t4, t6);
  EXPECT_LE(t1.events.size(), t2.events.size());
  const int64_t p1 = peak_bytes(t1), p2 = peak_bytes(t2), p4 = peak_bytes(t4), p6 = peak_bytes(t6);
  EXPECT_GT(p2, p1);
  // Every activation is b × (something) plus batch-independent storages (the
  // causal mask, scalars), and the peak is at the same event at every b, so
  // the peak is affine in b: p6 - p4 == p4 - p2 exactly. 64 bytes would
  // allow a few scalar-sized storages to move the argmax; a per-sequence
  // activation at seq 32 is ≥ 32 × 8 bytes, so any real non-linearity is
  // larger than that.
  EXPECT_NEAR(static_cast<double>(p6 - p4), static_cast<double>(p4 - p2), 64.0)
      << p2 << " " << p4 << " " << p6;
  // FLOPs of matmul-like ops are exactly linear in b, batch 1 included.
  EXPECT_DOUBLE_EQ(t2.forward_flops, 2 * t1.forward_flops);
  EXPECT_DOUBLE_EQ(t4.forward_flops, 4 * t1.forward_flops);
  EXPECT_DOUBLE_EQ(t2.backward_flops, 2 * t1.backward_flops);
}

TEST(TraceTest, Gpt2TinyForwardFlopsMatchTheFormula) {
  // 2·m·n·k per matmul, worked out from the architecture: per block c_attn,
  // Q·Kᵀ, P·V, c_proj, c_fc, mlp c_proj; then the tied lm_head on s-1
  // positions. An independent check of the tracer's FLOP counting.
  const auto c = models::resolve_model("gpt2-tiny");
  const double b = 2, s = 32, h = c.hidden, i = c.intermediate, v = c.vocab_size;
  const double t = b * s;
  const double block = 2 * t * h * 3 * h + 2 * b * s * s * h + 2 * b * s * s * h + 2 * t * h * h +
                       2 * t * h * i + 2 * t * i * h;
  const double expected = c.layers * block + 2 * b * (s - 1) * h * v;
  const auto tr = trace("gpt2-tiny", 2);
  EXPECT_DOUBLE_EQ(tr.forward_flops, expected);
  // Backward computes a gradient for both operands of every matmul (all of
  // them need one: the embeddings feed the first block), so 2× forward.
  EXPECT_DOUBLE_EQ(tr.backward_flops, 2 * expected);
}

TEST(TraceTest, CheckpointingBlocksLowersForwardPeakAndRecomputes) {
  const auto plain = trace("gpt2-tiny", 4);
  std::vector<int> blocks;
  for (size_t m = 0; m < plain.modules.size(); ++m)
    if (plain.modules[m].is_block) blocks.push_back(static_cast<int>(m));
  ASSERT_EQ(blocks.size(), 2u);
  const auto ckpt = trace("gpt2-tiny", 4, blocks);
  expect_allocs_and_frees_pair(ckpt);
  const int fwd = static_cast<int>(planner::Phase::kForward);
  EXPECT_LT(peak_bytes(ckpt, fwd), peak_bytes(plain, fwd));
  size_t recompute_events = 0;
  std::set<int> recomputed;
  for (const auto& e : ckpt.events)
    if (e.phase == planner::Phase::kRecompute) {
      ++recompute_events;
      if (e.kind == planner::MemEvent::kModuleBegin) recomputed.insert(e.module);
    }
  EXPECT_GT(recompute_events, 0u);
  for (int b : blocks) EXPECT_TRUE(recomputed.count(b)) << "block " << b << " not recomputed";
  for (const auto& e : plain.events) EXPECT_NE(e.phase, planner::Phase::kRecompute);
  // Recompute re-runs the blocks' forward matmuls, counted with backward.
  EXPECT_DOUBLE_EQ(ckpt.forward_flops, plain.forward_flops);
  EXPECT_GT(ckpt.backward_flops, plain.backward_flops);
}

TEST(TraceTest, BertTinyTraces) {
  const auto t1 = trace("bert-tiny", 1), t2 = trace("bert-tiny", 2), t3 = trace("bert-tiny", 3),
             t4 = trace("bert-tiny", 4);
  expect_allocs_and_frees_pair(t2);
  EXPECT_EQ(t2.param_numel(), models::resolve_model("bert-tiny").param_count());
  expect_affine(t2, t3, t4);
  EXPECT_GT(count_events(t2, planner::MemEvent::kModuleBegin), 20u);
  EXPECT_GT(t2.forward_flops, 0);
  EXPECT_DOUBLE_EQ(t2.forward_flops, 2 * t1.forward_flops);
  EXPECT_GT(peak_bytes(t2), peak_bytes(t1));
}

// FLOPs are proportional to the batch, and the time model's work by op
// (matrix product shapes, kernel bytes) affine in it: the planner's traces
// at batches 2 and 3 give any batch's (AffineTrace::work_at), for every
// family, with and without recompute, equal to a trace at that batch.
TEST(TraceTest, FlopsAreProportionalAndWorkAffineInTheBatch) {
  for (const char* name : {"gpt2-tiny", "bert-tiny", "llama-tiny", "qwen-tiny"}) {
    const auto config = models::resolve_model(name);
    std::vector<int> blocks;
    const auto table = models::module_table(config);
    for (size_t m = 0; m < table.size(); ++m)
      if (table[m].is_block) blocks.push_back(static_cast<int>(m));
    for (const std::vector<int>& ckpt : {std::vector<int>{}, blocks}) {
      SCOPED_TRACE(std::string(name) + (ckpt.empty() ? "" : " with recompute"));
      const auto t1 = trace(name, 1, ckpt), t2 = trace(name, 2, ckpt), t3 = trace(name, 3, ckpt);
      ASSERT_GT(t1.forward_flops, 0);
      EXPECT_EQ(t2.forward_flops, 2 * t1.forward_flops);
      EXPECT_EQ(t3.backward_flops, 3 * t1.backward_flops);
      const auto t5 = trace(name, 5, ckpt);
      const auto [fwd, bwd] = planner::AffineTrace(t2, t3).work_at(5);
      for (const auto& [got, want] : {std::pair{fwd, t5.forward_work}, std::pair{bwd, t5.backward_work}}) {
        EXPECT_TRUE(got.gemms == want.gemms);
        ASSERT_EQ(got.kernels.size(), want.kernels.size());
        for (size_t k = 0; k < got.kernels.size(); ++k) {
          EXPECT_EQ(got.kernels[k].op, want.kernels[k].op);
          EXPECT_EQ(got.kernels[k].calls, want.kernels[k].calls) << got.kernels[k].op;
          EXPECT_DOUBLE_EQ(got.kernels[k].bytes, want.kernels[k].bytes) << got.kernels[k].op;
        }
        EXPECT_EQ(got.nodes, want.nodes);
      }
      double flops = 0;
      for (const auto& g : t5.forward_work.gemms) flops += g.flops();
      EXPECT_EQ(flops, t5.forward_flops);  // the same products, shape by shape
      EXPECT_GT(t5.backward_work.nodes, 0);
      auto has = [](const planner::PhaseWork& w, const char* op) {
        for (const auto& k : w.kernels)
          if (k.op == op) return k.calls > 0 && k.bytes > 0;
        return false;
      };
      if (std::string(name) == "gpt2-tiny") {  // dropout's random numbers, GELU, the loss
        EXPECT_TRUE(has(t5.forward_work, "aten::native_dropout"));
        EXPECT_TRUE(has(t5.forward_work, "aten::gelu"));
        EXPECT_TRUE(has(t5.backward_work, "aten::_log_softmax_backward_data"));
      }
      for (const auto& w : {t5.forward_work, t5.backward_work})
        for (const auto& k : w.kernels) EXPECT_NE(k.op, "aten::view");  // views run no kernel
    }
  }
}

// The backward's nodes the time model charges are the step's own: the
// autograd graph of the same model's loss, run without the tracer, whose
// callbacks on each module's inputs and output are left out of the work.
TEST(TraceTest, TheBackwardsNodesAreTheLossGraphsWithoutTheTracers) {
  planner::register_missing_meta_kernels();
  for (const char* name : {"gpt2-tiny", "bert-tiny"}) {
    SCOPED_TRACE(name);
    const auto cfg = models::resolve_model(name);
    for (int64_t b : {1, 3}) {
      auto model = models::build_model(cfg, kMetaOpts);
      const auto ids = kMetaOpts.dtype(torch::kLong);
      models::Batch batch;
      batch.input_ids = torch::empty({b, 32}, ids);
      if (cfg.family == models::Family::kBert) {
        batch.token_type_ids = torch::empty({b, 32}, ids);
        batch.attention_mask = torch::empty({b, 32}, ids);
        batch.labels = torch::empty({b}, ids);
      }
      const auto loss = model->forward_loss(batch);
      std::set<torch::autograd::Node*> seen;
      std::vector<torch::autograd::Node*> stack = {loss.grad_fn().get()};
      while (!stack.empty()) {
        torch::autograd::Node* n = stack.back();
        stack.pop_back();
        if (!n || !seen.insert(n).second) continue;
        for (const auto& edge : n->next_edges()) stack.push_back(edge.function.get());
      }
      EXPECT_EQ(trace(name, b).backward_work.nodes, static_cast<int64_t>(seen.size())) << "batch " << b;
    }
  }
}

// The planner records its traces on every core at once (plan_builder.cc):
// each thread's recording must see only its own thread's allocations, ops
// and module boundaries, so traces recorded side by side equal those
// recorded one at a time, event for event.
TEST(TraceTest, TracesRecordedAtOnceOnFourThreadsEqualSerialOnes) {
  struct Job {
    const char* model;
    int64_t batch;
    planner::DType dtype;
    bool target_cuda;
    std::vector<int> ckpt;
  };
  std::vector<int> blocks;  // gpt2-tiny's blocks, recomputed in one job
  const auto table = models::module_table(models::resolve_model("gpt2-tiny"));
  for (size_t m = 0; m < table.size(); ++m)
    if (table[m].is_block) blocks.push_back(static_cast<int>(m));
  ASSERT_FALSE(blocks.empty());
  const std::vector<Job> jobs = {{"gpt2-tiny", 2, planner::DType::kF32, true, {}},
                                 {"gpt2-tiny", 3, planner::DType::kF16, true, blocks},
                                 {"llama-tiny", 2, planner::DType::kBF16, false, {}},
                                 {"bert-tiny", 2, planner::DType::kF32, false, {}}};
  auto record = [](const Job& j) {
    planner::TraceOptions o;
    o.batch = j.batch;
    o.seq_len = 32;
    o.dtype = j.dtype;
    o.target_cuda = j.target_cuda;
    o.cpu_threads = 1;
    o.recompute_modules = j.ckpt;
    return planner::trace_step(models::resolve_model(j.model), o);
  };
  std::vector<planner::ModelTrace> serial, parallel(jobs.size());
  for (const Job& j : jobs) serial.push_back(record(j));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < jobs.size(); ++i) threads.emplace_back([&, i] { parallel[i] = record(jobs[i]); });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < jobs.size(); ++i) {
      SCOPED_TRACE(std::string(jobs[i].model) + " round " + std::to_string(round));
      const auto& a = serial[i];
      const auto& b = parallel[i];
      ASSERT_EQ(a.events.size(), b.events.size());
      for (size_t e = 0; e < a.events.size(); ++e) {
        const auto &x = a.events[e], &y = b.events[e];
        ASSERT_TRUE(x.kind == y.kind && x.phase == y.phase && x.module == y.module && x.tensor == y.tensor &&
                    x.bytes == y.bytes && x.op == y.op)
            << "event " << e;
      }
      EXPECT_EQ(a.op_names, b.op_names);
      EXPECT_EQ(a.forward_flops, b.forward_flops);
      EXPECT_EQ(a.backward_flops, b.backward_flops);
    }
  }
}

TEST(TraceTest, BadOptionsThrow) {
  const auto c = models::resolve_model("gpt2-tiny");
  planner::TraceOptions o;
  o.batch = 0;
  EXPECT_THROW(planner::trace_step(c, o), std::invalid_argument);
  o.batch = 1;
  o.seq_len = c.max_positions + 1;
  EXPECT_THROW(planner::trace_step(c, o), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit
