// A run's options as given (`shardfit run` builds them from its command line), and the job they resolve to once the
// plan (if any) and the defaults are applied: model, candidate, batch,
// sequence, loss, attention, budget, device profile. resolve_job makes every
// check that needs no rank (spec::BadInput, one line naming the option).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/adamw.h"
#include "models/model_config.h"
#include "planner/candidate.h"
#include "spec/job.h"

namespace shardfit::launch {

struct RunRequest {
  std::string model;
  std::string strategy = "ddp/fp32/wrap=none";
  int64_t batch = 1;
  int64_t seq_len = 0;  // not given: the plan's, else min(128, the model's positions)
  int64_t steps = 10;
  uint64_t seed = 1234;
  std::string data = "synthetic";
  std::string device = "cpu";
  std::string out;
  std::string gpu_mem;
  double lr = executor::AdamWOptions{}.lr;
  double weight_decay = executor::AdamWOptions{}.weight_decay;
  int nproc = 0;
  std::string backend;  // "": nccl with --device cuda, else gloo
  std::string profile;  // the prediction's device profile; "": see resolve_job
  int rank = -1;       // loopback; -1 = not given (rank 0)
  int world_size = 0;  // loopback; 0 = 1
  int64_t gpus_per_node = 0;  // given: hybrid's shard group (else the launcher's or the plan's)
  double timeout_s = 300;
  std::string plan;
  std::string candidate;
  int64_t grad_accum = 1;
  int prefetch = 1;
  double ddp_bucket_cap_mb = spec::kDdpBucketCapBytes / (1024.0 * 1024);
  bool async_reduce = false;
  bool async_gather = false;
  double clip_grad_norm = 0;
  bool reference_trainer = false;
  bool oom_ok = false;  // an out-of-memory run exits 0 (validate's max+1 runs), not 4
  std::string save;         // checkpoint root
  int64_t save_every = 0;
  std::string resume;       // a checkpoint directory or a --save root
  std::string export_path;  // safetensors file from the last checkpoint
  bool oversubscribe = false;    // --nproc above the cores
  bool resume_anyway = false;    // resume despite options that break bit-exactness
  bool allow_nonfinite = false;  // train on through a NaN/Inf loss
  bool save_on_signal = false;   // SIGTERM/SIGINT: finish the step, save it, exit 128+sig
  std::string init;         // Hugging Face checkpoint to start from (executor/hf_init.h)
  std::string loss;         // "": full, or the plan's
  std::string attention;    // "": the plan's, else sdpa
  std::string allocator_history;  // cuda: rank 0's caching-allocator history, written here
  // Which options the user gave (a plan fills in the others).
  bool batch_given = false, seq_len_given = false, strategy_given = false, grad_accum_given = false,
       prefetch_given = false, ddp_bucket_cap_given = false, gpus_per_node_given = false;
  std::string command_line;
  std::string profiles_dir;  // where the device profiles are (the CLI's: next to the binary)
};

// What one job runs, after the plan (if any) and the defaults are applied:
// the job (spec::JobOptions: --seq-len, --steps, --grad-accum, and the
// schedule's options, each the option's or else the plan's) and the rest.
struct Job : spec::JobOptions {
  models::ModelConfig model;
  planner::Candidate candidate;
  int64_t batch = 1;
  std::string loss = "full";   // --loss, else the plan's
  std::string attention = "sdpa";  // --attention, else the plan's; sdpa resolved for the job's device
  int64_t budget_bytes = 0;
  int plan_world = 0;          // the plan's GPUs x nodes; 0 without a plan
  int plan_gpus_per_node = 0;  // the plan's GPUs per node
  std::string device = "cpu";   // --device
  std::string profile = "cpu";  // what predict() plans for
  std::vector<std::string> resume_changes;  // --resume-anyway: what differs from the checkpoint
};

// --device cuda predicts for this profile when neither --profile nor a CUDA
// plan names one: the reference scenario's card, the one `--gpu-mem 24GiB`
// emulates on a bigger GPU (scripts/gpu-check).
inline constexpr const char* kDefaultCudaProfile = "titan-rtx-24gb";

Job resolve_job(const RunRequest& a);

}  // namespace shardfit::launch
