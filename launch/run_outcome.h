// How a run ends (SPEC): the per-rank report figures (measured beside
// predicted), exit 4 when a rank went out of memory (the report is written
// anyway) unless --oom-ok, which `validate` passes for its max+1 runs, and
// the ranks' agreement on the job before they train.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "executor/comm.h"
#include "executor/engine_comm.h"
#include "executor/launcher.h"
#include "executor/meter.h"
#include "planner/plan_builder.h"
#include "reports/run_report.h"

namespace shardfit::launch {

// kExitOom (with one line on stderr naming the ranks and the report) when
// a rank of `report` went out of memory and !oom_ok; else kExitOk.
int oom_exit(bool oom_ok, const std::string& report_path, const reports::RunReport& report);

// Whether a `--nproc` launch ended only because its leader said "out of
// memory" (exit 4): a verdict, not a crash.
bool launch_went_oom(const executor::LaunchResult& result);

// The planner's figures as the report carries them (with the per-class
// timeline).
reports::MemoryFigures predicted_figures(const planner::StepSimResult& sim);

// `cuda_peak_reserved` >= 0: a CUDA run, whose reserved figures (peak and
// timeline) are the caching allocator's; -1: CPU, nothing is cached.
reports::RankReport rank_report(int rank, int64_t peak,
                                const std::vector<executor::TimelinePoint>& timeline, bool oom,
                                const std::string& oom_message, int64_t cuda_peak_reserved = -1);

// peak_error_pct on the figure that decides OOM on the device (SPEC):
// reserved on CUDA (`on_reserved`), allocated on the CPU.
void attach_prediction(std::vector<reports::RankReport>& ranks,
                       const std::optional<planner::CandidatePrediction>& pred,
                       bool on_reserved = false);

// Every rank's JSON text, on every rank: lengths, then the bytes, each
// all-gathered (a zero-padded all-reduce). Host memory, not counted (nccl:
// through `device`).
std::vector<std::string> all_gather_strings(executor::Communicator& comm, const std::string& mine,
                                            c10::Device device);
nlohmann::json rank_json(const reports::RankReport& r);
reports::RankReport rank_from_json(const nlohmann::json& j);

// Every rank's job, option by option ("--batch" -> "4"), compared at
// rendezvous: the first option where a rank differs from rank 0 is thrown
// as spec::BadInput naming it and both values, on every rank alike (each sees
// all), before any strategy-specific collective could abort inside Gloo.
void check_ranks_agree(executor::Communicator& comm, const std::map<std::string, std::string>& job,
                       c10::Device device);

}  // namespace shardfit::launch
