// Slurm's task variables become torchrun's (executor/slurm_env.h).
#include "executor/slurm_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace shardfit::executor {
namespace {

using Hosts = std::vector<std::string>;

TEST(Hostlist, ExpandsSlurmsCompressedForm) {
  EXPECT_EQ(expand_hostlist("node[01-04,07]"),
            (Hosts{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_hostlist("gpu5"), (Hosts{"gpu5"}));
  EXPECT_EQ(expand_hostlist("a[1-2],b3,c[9-10]"), (Hosts{"a1", "a2", "b3", "c9", "c10"}));
  EXPECT_EQ(expand_hostlist("r[1-2]n[3-4]"), (Hosts{"r1n3", "r1n4", "r2n3", "r2n4"}));
  EXPECT_EQ(expand_hostlist("node[008-011]"), (Hosts{"node008", "node009", "node010", "node011"}));
  EXPECT_THROW(expand_hostlist("node[01-04"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[4-1]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[a-b]"), std::invalid_argument);
}

// A typo's range is not expanded name by name (node[0-99999999999] listed
// every one), and a number std::stol cannot hold is the same one line.
TEST(Hostlist, RangesPastAnyJobAreOneLine) {
  for (const char* list : {"node[0-99999999]", "node[0-99999999999]", "node[1-99999999999999999999]",
                           "a[1-300]b[1-300]"}) {
    try {
      expand_hostlist(list);
      ADD_FAILURE() << list << " was expanded";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(list), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(expand_hostlist("n[1-65536]").size(), 65536u);
}

class SlurmEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  static std::string get(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "<unset>";
  }
  static constexpr const char* kVars[] = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_LOCALID",
                                          "SLURM_NODELIST",
                                          "SLURM_JOB_NODELIST",
                                          "SLURM_STEP_NODELIST",
                                          "SLURM_TASKS_PER_NODE",
                                          "SLURM_STEP_TASKS_PER_NODE",
                                          "SLURM_NNODES",
                                          "SLURM_JOB_ID"};
};

TEST_F(SlurmEnv, SetsTorchrunsVariablesFromSlurms) {
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  ::setenv("SLURM_JOB_NODELIST", "gpu[07-08]", 1);
  ::setenv("SLURM_JOB_ID", "123456", 1);
  EXPECT_TRUE(apply_slurm_env());
  EXPECT_EQ(get("RANK"), "5");
  EXPECT_EQ(get("WORLD_SIZE"), "8");
  EXPECT_EQ(get("LOCAL_RANK"), "1");
  EXPECT_EQ(get("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(get("MASTER_ADDR"), "gpu07");  // the first host
  EXPECT_EQ(get("MASTER_PORT"), "29956");  // 29500 + 123456 % 1000
}

TEST_F(SlurmEnv, CountsAreReadExactlyNeverWrapped) {
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "99999999999", 1);
  ::setenv("SLURM_NODELIST", "gpu1", 1);
  try {
    apply_slurm_env();
    ADD_FAILURE() << "SLURM_NTASKS=99999999999 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NTASKS='99999999999'"), std::string::npos) << e.what();
  }
}

TEST_F(SlurmEnv, WhatIsAlreadySetWins) {
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_NODELIST", "node[01-02]", 1);
  ::setenv("MASTER_ADDR", "10.0.0.9", 1);
  ::setenv("MASTER_PORT", "40000", 1);
  EXPECT_TRUE(apply_slurm_env());
  EXPECT_EQ(get("MASTER_ADDR"), "10.0.0.9");
  EXPECT_EQ(get("MASTER_PORT"), "40000");
  EXPECT_EQ(get("LOCAL_WORLD_SIZE"), "2");  // no per-node count: the world on one node
  // torchrun's own RANK (torchrun inside an allocation): Slurm's are ignored.
  SetUp();
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("RANK", "0", 1);
  EXPECT_FALSE(apply_slurm_env());
  EXPECT_EQ(get("WORLD_SIZE"), "<unset>");
}

TEST_F(SlurmEnv, NothingWithoutSlurmAndOneLineErrors) {
  EXPECT_FALSE(apply_slurm_env());
  EXPECT_EQ(get("RANK"), "<unset>");
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_NODELIST", "n1", 1);
  EXPECT_THROW(apply_slurm_env(), std::invalid_argument);  // rank outside the world
  ::setenv("SLURM_PROCID", "x", 1);
  try {
    apply_slurm_env();
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID"), std::string::npos) << e.what();
  }
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NODELIST", "n[1-", 1);
  try {
    apply_slurm_env();
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NODELIST"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardfit::executor
