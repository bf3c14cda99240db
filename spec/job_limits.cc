#include "spec/job_limits.h"

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

void check_grad_accum(int64_t grad_accum) {
  check_count("--grad-accum", grad_accum, kMaxGradAccum, "micro-batches per optimizer step");
}

void check_steps(int64_t steps) { check_count("--steps", steps, kMaxSteps, "training steps"); }

}  // namespace shardfit::spec
