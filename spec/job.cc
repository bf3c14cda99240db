#include "spec/job.h"

#include <stdexcept>
#include <string>

namespace shardfit::spec {
namespace {
// "--OPTION N: must be at least 1" or "--OPTION N: at most MAX (WHY)".
void check_count(const char* option, int64_t value, long long max, const char* why) {
  if (value < 1) throw std::invalid_argument(std::string(option) + " " + std::to_string(value) + ": must be at least 1");
  if (value > max)
    throw std::invalid_argument(std::string(option) + " " + std::to_string(value) + ": at most " +
                                std::to_string(max) + " (" + why + ")");
}
}  // namespace

void check_batch(int64_t batch) { check_count("--batch", batch, kMaxBatch, "sequences per GPU per micro-batch"); }

void check_seq_len(int64_t seq_len) { check_count("--seq-len", seq_len, kMaxSeqLen, "tokens per sequence"); }

void check_steps(int64_t steps) { check_count("--steps", steps, kMaxSteps, "training steps"); }

void check_grad_accum(int64_t grad_accum) {
  check_count("--grad-accum", grad_accum, kMaxGradAccum, "micro-batches per optimizer step");
}

void check_gpus_per_node(int64_t gpus, const char* option) { check_count(option, gpus, kMaxGpusPerNode, "GPUs per node"); }

void check_nodes(int64_t nodes) { check_count("--nodes", nodes, kMaxNodes, "nodes"); }

void check_job_options(const JobOptions& job) {
  check_seq_len(job.seq_len);
  check_steps(job.steps);
  check_grad_accum(job.grad_accum);
  check_schedule_options(job.schedule);
}

}  // namespace shardfit::spec
