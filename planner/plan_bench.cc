// Planner speed (Google Benchmark; not a test): the full default sweep of
// `shardfit plan` (every candidate, batch search included), and how it grows
// with layers, sequence length and GPUs.
//   build/planner/plan_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include "planner/plan_builder.h"
#include "planner/trace.h"

namespace {

using namespace shardfit;

std::string profiles_dir() { return SHARDFIT_SOURCE_DIR "/profiles"; }

planner::PlanRequest request(const models::ModelConfig& m, int64_t seq) {
  planner::PlanRequest r;
  r.model = m;
  r.seq_len = seq;
  r.gpus_per_node = 2;
  r.profile = planner::load_profile("titan-rtx-24gb", profiles_dir());
  return r;
}

void BM_PlanDefaultSweep(benchmark::State& state, const char* model) {
  const auto r = request(models::resolve_model(model), 128);
  size_t candidates = 0;
  for (auto _ : state) candidates = planner::build_plan(r).candidates.size();
  state.counters["candidates"] = static_cast<double>(candidates);
}
BENCHMARK_CAPTURE(BM_PlanDefaultSweep, gpt2_large, "gpt2-large")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanDefaultSweep, gpt2_xl, "gpt2-xl")->Unit(benchmark::kMillisecond);

// GPT-2 XL widths with a varying number of layers: trace + plan of the
// zero3 candidates, so growth with depth shows.
void BM_PlanLayers(benchmark::State& state) {
  auto m = models::resolve_model("gpt2-xl");
  m.layers = state.range(0);
  auto r = request(m, 128);
  r.candidates.strategies = {"zero3"};
  r.candidates.precisions = {"fp32"};
  for (auto _ : state) benchmark::DoNotOptimize(planner::build_plan(r));
}
BENCHMARK(BM_PlanLayers)->Arg(12)->Arg(24)->Arg(48)->Arg(96)->Unit(benchmark::kMillisecond);

void BM_PlanSeqLen(benchmark::State& state) {
  auto r = request(models::resolve_model("gpt2-xl"), state.range(0));
  r.candidates.strategies = {"zero3"};
  r.candidates.precisions = {"fp32"};
  for (auto _ : state) benchmark::DoNotOptimize(planner::build_plan(r));
}
BENCHMARK(BM_PlanSeqLen)->Arg(128)->Arg(256)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond);

// llama-3.1-8b's full default sweep on H100s: 8 GPUs on one node, then 8
// per node on 8 and 64 nodes (hybrid sharding adds candidates across nodes).
void BM_PlanGpus(benchmark::State& state) {
  auto r = request(models::resolve_model("llama-3.1-8b"), 4096);
  r.profile = planner::load_profile("h100-80gb", profiles_dir());
  r.gpus_per_node = 8;
  r.nodes = static_cast<int>(state.range(0)) / 8;
  size_t candidates = 0;
  for (auto _ : state) candidates = planner::build_plan(r).candidates.size();
  state.counters["candidates"] = static_cast<double>(candidates);
}
BENCHMARK(BM_PlanGpus)->Arg(8)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond);

void BM_TraceStep(benchmark::State& state) {
  const auto m = models::resolve_model("gpt2-xl");
  planner::TraceOptions o;
  o.batch = 2;
  o.seq_len = 128;
  size_t events = 0;
  for (auto _ : state) events = planner::trace_step(m, o).events.size();
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_TraceStep)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
