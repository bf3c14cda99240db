// Under Slurm (`srun`), each task is a rank of one job (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST's first host as the
// rendezvous), and ranks started with different options stop together
// with exit 2 naming the option, instead of training silently or aborting
// inside Gloo.
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

std::string slurm_env(int rank, int port) {
  return "-u RANK -u WORLD_SIZE -u MASTER_ADDR SLURM_PROCID=" + std::to_string(rank) +
         " SLURM_NTASKS=2 SLURM_LOCALID=" + std::to_string(rank) +
         " SLURM_TASKS_PER_NODE=2 SLURM_NODELIST=localhost MASTER_PORT=" + std::to_string(port) +
         " ";
}

// Both tasks at once, as srun starts them.
std::pair<Result, Result> srun(const std::vector<std::string>& rank0,
                               const std::vector<std::string>& rank1) {
  static int attempt = 0;
  const int port = 20000 + (::getpid() * 7 + attempt++ * 13) % 20000;
  Result r0, r1;
  std::thread t1([&] { r1 = shardfit(rank1, "env " + slurm_env(1, port)); });
  r0 = shardfit(rank0, "env " + slurm_env(0, port));
  t1.join();
  return {r0, r1};
}

std::vector<std::string> tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"run",     "--model", "gpt2-tiny", "--seq-len", "16",
                                   "--steps", "1",       "--timeout", "60"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(Slurm, EachTaskIsARankOfOneJob) {
  const std::string out = temp_path("report.json");
  const auto [r0, r1] = srun(tiny({"--strategy", "zero3/fp32/wrap=block", "--out", out}),
                             tiny({"--strategy", "zero3/fp32/wrap=block", "--out", out}));
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  const auto rep = nlohmann::json::parse(read_file(out));
  std::remove(out.c_str());
  EXPECT_EQ(rep["run"]["world_size"], 2);
  EXPECT_EQ(rep["ranks"].size(), 2u);
}

void expect_both_refuse(const std::pair<Result, Result>& rs, const std::string& option) {
  for (const Result* r : {&rs.first, &rs.second}) {
    EXPECT_EQ(r->exit_code, 2) << r->err;
    ASSERT_FALSE(r->err.empty());
    // The last line is the verdict, naming the option (and no abort inside Gloo).
    std::string last = r->err.substr(0, r->err.size() - 1);
    last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
    EXPECT_NE(last.find("error: " + option + ": rank 1 has"), std::string::npos) << r->err;
    EXPECT_EQ(r->err.find("Abort"), std::string::npos) << r->err;
  }
}

TEST(Slurm, RanksWithDifferentOptionsStopWithExitTwoNamingIt) {
  expect_both_refuse(srun(tiny({"--batch", "2"}), tiny({"--batch", "3"})), "--batch");
  expect_both_refuse(srun(tiny({"--strategy", "zero3/fp32/wrap=block"}),
                          tiny({"--strategy", "ddp/fp32/wrap=none"})),
                     "--strategy");
}

}  // namespace
}  // namespace shardfit::cli_test
