// The request's checks (plan_request_checks.h).
#include "planner/plan_request_checks.h"

#include <stdexcept>
#include <string>

#include "models/model_config.h"
#include "planner/trace_file.h"
#include "spec/job.h"

namespace shardfit::planner {

void check_request(const PlanRequest& r) {
  const TraceFile* file = r.trace_file.get();
  spec::check_gpus_per_node(r.gpus_per_node);
  spec::check_nodes(r.nodes);
  spec::check_job_options(r);
  if (file) {
    if (r.seq_len != file->seq_len)
      throw std::invalid_argument("--seq-len " + std::to_string(r.seq_len) + ": the trace file was recorded at " +
                                  std::to_string(file->seq_len));
    if (file->target_cuda != (r.profile.kind == DeviceKind::kCuda))
      throw std::invalid_argument("--trace: recorded for " + std::string(file->target_cuda ? "CUDA" : "the CPU") +
                                  "'s kernels, but " + r.profile.name + " is " +
                                  (file->target_cuda ? "the CPU" : "a CUDA device") +
                                  ": record it again with --target " + (file->target_cuda ? "cpu" : "cuda"));
  } else {
    models::check_seq_len(r.model, r.seq_len);
  }
}

// A CPU profile has no memory of its own (cpu.json: the budget is
// --gpu-mem), so without one every batch fits and the search ends at its
// cap. A bf16 candidate on a CPU is traced at each batch the search tries
// (TraceSource::record), and each trace runs the step's matrix products
// once on CPU tensors of their real sizes (cpu_matmul_probe.cc): at the cap
// that is hours of compute and more memory than the host has. Refused
// before any trace, naming the two ways out.
void check_cpu_bf16_budget(const std::vector<Candidate>& candidates, bool cuda, const TraceFile* file,
                           int64_t device_mem, int64_t max_batch) {
  if (cuda || file || device_mem > 0) return;
  for (const Candidate& c : candidates)
    if (compute_dtype(c.precision) == DType::kBF16)
      throw std::invalid_argument(
          "--gpu-mem: a cpu plan with bf16 candidates needs each rank's memory (a bf16 candidate is traced by "
          "running its matrix products at every batch the search tries, and with no limit that is batch " +
          std::to_string(max_batch) + "): give --gpu-mem SIZE, or --precision fp32");
}

}  // namespace shardfit::planner
