// What a real card measured, as tests: every run of shardfit's engine on
// CUDA recorded in reports/gpu/gpu-check-*.json (scripts/gpu-check: `shardfit
// run --device cuda --backend loopback --gpu-mem 24GiB`, rank 0 of a world
// of N) is planned again here, on the H200 profile with the same cap, and
// the plan must agree with what happened: a batch that fitted is at most one
// past the plan's max batch, a batch that ran out of memory at most the
// plan's max, and at a batch that fitted the predicted peak reserved is
// within 2% of the measured one. A new report in that folder is a new test
// case; a change to the planner that moves a prediction off a measurement
// fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/plan_builder.h"

namespace shardfit::planner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// scripts/gpu-check's --gpu-mem: the cap every recorded run ran under.
constexpr int64_t kCapBytes = int64_t{24} << 30;

// Reports whose engine runs are not measurements, and why.
const std::map<std::string, std::string> kNotMeasurements = {
    {"gpu-check-20261204T114826Z.json",
     "its engine runs shared the card with PyTorch's reference rows; the CUDA meter reads the card's free "
     "memory with cudaMemGetInfo, which counts every process (reports/gpu/README.md)"},
};

// Misses the planner is known to make, each asserted to still be one (so a
// fix shows up here too), with what is missing from the model.
const std::map<std::string, std::string> kKnownMisses = {
    {"gpt2-large zero2/fp32/wrap=size:1000000 world 2",
     "out of memory at 26 with 2.2 GiB reserved but unallocated at a 634 MiB request: the caching allocator's "
     "fragmentation at that size is beyond the allocator model (the plan says 27)"},
};

// Peak reserved the allocator model is known to miss by more than 2%, by
// "model candidate batch": asserted to still miss, as above.
const std::map<std::string, std::string> kKnownReservedMisses = {
    {"gpt2-large zero3/fp32/wrap=size:1000000 world 2 31",
     "predicted 25,207,767,040 B reserved, measured 24,471,666,688 (+3.0%), peak allocated within 0.4%, no "
     "cudaMalloc retry: the model keeps 0.7 GB more cached-but-free near the cap than torch 2.11's allocator did"},
    {"gpt2-large zero3/fp32/wrap=size:2000 world 2 31", "as size:1000000 at 31 (+3.0%)"},
    {"gpt2-xl zero3/fp32/wrap=size:2000 world 2 14",
     "predicted 25,211,961,344 B reserved, measured 23,685,234,688 (+6.4%), peak allocated within 0.3%: as GPT-2 "
     "Large zero3, more so"},
    {"gpt2-xl zero3/fp32/wrap=size:2000 world 2 15",
     "predicted 25,214,058,496 B reserved, measured 24,521,998,336 (+2.8%), peak allocated 23,872,465,920: the "
     "model's segments grow to the cap less what is outside the allocator, torch 2.11's stopped 0.7 GB short"},
};

struct Outcome {
  int64_t batch = 0;
  bool oom = false;
  int64_t peak_reserved_bytes = 0;  // 0 when not recorded (an out-of-memory run)
  std::string report;
};

struct Job {
  std::string model, id;
  int world = 0;
  std::vector<Outcome> outcomes;
};

std::map<std::string, Job> recorded_jobs() {
  std::map<std::string, Job> jobs;
  const fs::path dir = fs::path(SHARDFIT_SOURCE_DIR) / "reports" / "gpu";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("gpu-check-", 0) != 0 || entry.path().extension() != ".json") continue;
    if (kNotMeasurements.count(name)) continue;
    std::ifstream in(entry.path());
    const json report = json::parse(in);
    for (const json& run : report.value("runs", json::array())) {
      const std::string verdict = run.value("verdict", "");
      const bool oom_exit = verdict.rfind("ran (out of memory", 0) == 0;
      if (verdict != "ran" && !oom_exit) continue;  // skipped, refused or not built: nothing happened
      Outcome o;
      o.batch = std::stoll(run.at("batch").get<std::string>());
      o.oom = oom_exit || run.value("report", json::object()).value("oom", false);
      if (!o.oom) o.peak_reserved_bytes = run.at("report").at("measured").at("peak_reserved_bytes").get<int64_t>();
      o.report = name;
      // One job per model, candidate and world: the same candidate on 1 GPU
      // and on 2 shards differently.
      const std::string key = run.at("model").get<std::string>() + " " + run.at("id").get<std::string>() +
                              " world " + run.at("world").get<std::string>();
      Job& job = jobs[key];
      job.model = run.at("model").get<std::string>();
      job.id = run.at("id").get<std::string>();
      job.world = std::stoi(run.at("world").get<std::string>());
      job.outcomes.push_back(o);
    }
  }
  return jobs;
}

PlanRequest loopback_request(const Job& job) {
  PlanRequest r;
  r.model = models::resolve_model(job.model);
  r.seq_len = 128;
  r.gpus_per_node = job.world;
  r.profile = load_profile("h200-141gb", SHARDFIT_SOURCE_DIR "/profiles");
  r.device_mem_bytes = kCapBytes;
  r.nccl_communicator = false;  // --backend loopback
  r.candidates.strategies = {job.id};
  return r;
}

TEST(RecordedGpuRuns, ThereAreRecordsToCheck) {
  const auto jobs = recorded_jobs();
  size_t outcomes = 0;
  for (const auto& [key, job] : jobs) outcomes += job.outcomes.size();
  // The 2026-11-30 and 2026-12-04 H200 runs hold 30 engine runs of 10 jobs
  // (every reference row, GPT-2 XL offload on 1 GPU and on 2).
  EXPECT_GE(jobs.size(), 10u);
  EXPECT_GE(outcomes, 30u);
}

TEST(RecordedGpuRuns, ThePlanAgreesWithEveryFitAndEveryOutOfMemory) {
  for (const auto& [key, job] : recorded_jobs()) {
    const PlanRequest r = loopback_request(job);
    const Plan plan = build_plan(r);
    const PlanCandidate* c = plan.find(job.id);
    ASSERT_NE(c, nullptr) << key;
    const int64_t max = c->max_batch_per_gpu;
    bool agrees = true;
    std::string seen;
    for (const Outcome& o : job.outcomes) {
      seen += " " + std::to_string(o.batch) + (o.oom ? " OOM" : " fits") + " (" + o.report + ");";
      agrees = agrees && (o.oom ? o.batch >= max : o.batch <= max + 1);
    }
    const auto miss = kKnownMisses.find(key);
    if (miss == kKnownMisses.end()) {
      EXPECT_TRUE(agrees) << key << ": plan max " << max << ", measured" << seen;
    } else {
      EXPECT_FALSE(agrees) << key << " now agrees with its measurements (plan max " << max << ", measured" << seen
                           << "): take it off kKnownMisses (" << miss->second << ")";
    }
  }
}

TEST(RecordedGpuRuns, PeakReservedWithinTwoPercentWhereTheBatchFitted) {
  for (const auto& [key, job] : recorded_jobs()) {
    const PlanRequest r = loopback_request(job);
    for (const Outcome& o : job.outcomes) {
      if (o.oom) continue;
      const CandidatePrediction p = predict_candidate(r, spec::parse_candidate(job.id), o.batch);
      const double err = 100.0 * static_cast<double>(p.sim.peak_reserved_bytes - o.peak_reserved_bytes) /
                         static_cast<double>(o.peak_reserved_bytes);
      const std::string what = key + " " + std::to_string(o.batch);
      if (kKnownReservedMisses.count(what)) {
        EXPECT_GT(std::abs(err), 2.0) << what << " (" << o.report << ") is now within 2% (" << err
                                      << "%): take it off kKnownReservedMisses";
        continue;
      }
      EXPECT_LE(std::abs(err), 2.0) << what << " (" << o.report << "): predicted " << p.sim.peak_reserved_bytes
                                    << " B reserved, measured " << o.peak_reserved_bytes;
    }
  }
}

}  // namespace
}  // namespace shardfit::planner
