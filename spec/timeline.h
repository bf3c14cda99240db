// One point of a memory timeline: the one type wherever a timeline is, the
// simulator's prediction (planner/step_simulator.h), a meter's measurement
// (executor/meter.h) and a report's figures (reports/run_report.h), so that
// predicted and measured are compared point by point. A point is taken when
// a phase ends.
#pragma once

#include <cstdint>
#include <string>

namespace shardfit::spec {

struct TimelinePoint {
  // The phase that ended: "init", "step1/forward/<unit>",
  // "step1/backward/<unit>", "step1/optimizer", ... (<unit> a wrap unit's
  // name, "root" for the root); with grad_accum k a step's forward and
  // backward labels come k times. Reports write it as "phase".
  std::string label;
  int64_t allocated_bytes = 0;  // live when the phase ended
  // What the device's allocator holds: a caching allocator's segments (CUDA,
  // and the simulator's model of it); on the CPU, the allocated bytes.
  int64_t reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;  // the highest allocated bytes since the previous point
  int64_t peak_reserved_bytes = 0;   // the same for reserved (measured on CUDA only; else 0)
};

}  // namespace shardfit::spec
