// What build_plan (plan_builder.cc) checks of a request before anything is
// traced, each rule once, each failure one line (std::invalid_argument).
#pragma once

#include <cstdint>
#include <vector>

#include "planner/candidate.h"
#include "planner/plan_builder.h"

namespace shardfit::planner {

// The job's sizes and options, and a trace file's fit to the request (its
// sequence length, the kernels it was recorded for); without a file, the
// model takes the sequence length.
void check_request(const PlanRequest& r);

// A bf16 candidate on a CPU needs a memory budget (the .cc says why).
void check_cpu_bf16_budget(const std::vector<Candidate>& candidates, bool cuda, const TraceFile* file,
                           int64_t device_mem, int64_t max_batch);

}  // namespace shardfit::planner
