// `validate` on both of its backends, for a plan of two GPUs: gloo runs the
// plan's world as --nproc ranks (allowed past this machine's cores), loopback
// rehearses rank 0 of it in one process. Each run it starts must accept the
// options validate gives it.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

TEST(ValidateBackends, GlooAndLoopbackBothCheckATwoGpuPlan) {
  const std::string plan = temp_path("two-gpu-plan.json");
  Result r = shardfit({"plan", "--model", "gpt2-tiny", "--seq-len", "16", "--gpus", "2", "--device", "cpu",
                       "--gpu-mem", "12MiB", "--strategies", "ddp/fp32/wrap=none", "--out", plan, "--log-level",
                       "warn"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* backend : {"gloo", "loopback"}) {
    const std::string dir = temp_path(std::string("validate-") + backend);
    r = shardfit({"validate", "--plan", plan, "--backend", backend, "--out-dir", dir, "--log-level", "warn"});
    std::filesystem::remove_all(dir);
    // max fits, max+1 goes out of memory: the check passes.
    EXPECT_EQ(r.exit_code, 0) << backend << ": " << r.out << r.err;
    EXPECT_NE(r.out.find("ddp/fp32/wrap=none"), std::string::npos) << backend << ": " << r.out;
    EXPECT_NE(r.out.find(" ok"), std::string::npos) << backend << ": " << r.out;
  }
  std::remove(plan.c_str());
}

}  // namespace
}  // namespace shardfit::cli_test
