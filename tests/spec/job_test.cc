// The job's rules (spec/job.h): what `plan` and `run` both read, each
// refused with one line naming the option as the CLI spells it.
#include "spec/job.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace shardfit::spec {
namespace {

// The one line `check` throws (std::invalid_argument), or "" when it passes.
std::string refusal(const std::function<void()>& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(JobOptions, DefaultsAreAJobEveryLayerRuns) {
  const JobOptions job;
  EXPECT_EQ(refusal([&] { check_job_options(job); }), "");
  EXPECT_EQ(job.grad_accum, 1);
  EXPECT_EQ(job.schedule.prefetch, 1);  // FSDP's BACKWARD_PRE
  EXPECT_EQ(job.schedule.ddp_bucket_cap_bytes, kDdpBucketCapBytes);
}

TEST(JobOptions, EachFieldMeetsItsOptionsRule) {
  JobOptions job;
  job.seq_len = 0;
  EXPECT_EQ(refusal([&] { check_job_options(job); }), "--seq-len 0: must be at least 1");
  job = {};
  job.seq_len = kMaxSeqLen + 1;
  EXPECT_EQ(refusal([&] { check_job_options(job); }), "--seq-len 1048577: at most 1048576 (tokens per sequence)");
  job = {};
  job.steps = -1;
  EXPECT_EQ(refusal([&] { check_job_options(job); }), "--steps -1: must be at least 1");
  job = {};
  job.grad_accum = kMaxGradAccum + 1;
  EXPECT_EQ(refusal([&] { check_job_options(job); }),
            "--grad-accum 4097: at most 4096 (micro-batches per optimizer step)");
  job = {};
  job.schedule.prefetch = 0;  // the schedule's own case for tests, not a job's
  EXPECT_EQ(refusal([&] { check_job_options(job); }), "--prefetch 0: must be at least 1");
  job = {};
  job.schedule.ddp_bucket_cap_bytes = 0;
  EXPECT_NE(refusal([&] { check_job_options(job); }).find("--ddp-bucket-cap-mb"), std::string::npos);
}

TEST(JobOptions, SizesOutsideTheJobHaveTheirOwnRules) {
  EXPECT_EQ(refusal([] { check_batch(kMaxBatch); }), "");
  EXPECT_EQ(refusal([] { check_batch(0); }), "--batch 0: must be at least 1");
  EXPECT_EQ(refusal([] { check_gpus_per_node(1025); }), "--gpus 1025: at most 1024 (GPUs per node)");
  EXPECT_EQ(refusal([] { check_gpus_per_node(0, "--gpus-per-node"); }), "--gpus-per-node 0: must be at least 1");
  EXPECT_EQ(refusal([] { check_nodes(kMaxNodes); }), "");
  EXPECT_EQ(refusal([] { check_nodes(kMaxNodes + 1); }), "--nodes 65537: at most 65536 (nodes)");
}

}  // namespace
}  // namespace shardfit::spec
