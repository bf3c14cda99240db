// `shardfit calibrate --device cpu [--nproc N] --out FILE`'s work: measures what the
// time model's cpu profile otherwise guesses and writes a
// profile with those figures, for `plan --device FILE` and `run --profile
// FILE`:
//   peak_flops_per_s.{fp32,bf16,fp16}  a square matmul at the size where one
//       takes >= 20 ms (from 256, doubling, at most 2048), with the intra-op
//       threads one of N ranks gets (as `run --nproc N` gives each rank);
//   memory_bytes_per_s (and host memory, host link: the same DRAM)  an
//       out-of-place add of 64 MiB fp32 tensors (3 × 64 MiB moved);
//   measured_kernels  what the time model times a step op by op with
//       (planner/time_model.h): each dtype's matmul rate on a grid of shapes
//       (m, n, k in 16..1024) and its compute-bound kernels' rates, and one
//       small kernel's dispatch overhead;
//   measured_kernels.adamw_steps (--stack pytorch)  what torch.optim.AdamW's
//       step costs to dispatch, for-loop, foreach and fused, over plain
//       tensors and over FSDP2's DTensors: a fixed cost, one a tensor and
//       one a distinct shape (pytorch/calibrate_stack.py, run by the
//       project's Python first, so that a machine without PyTorch fails at
//       once); what this PyTorch cannot run is left out and named;
//   measured_kernels.fsdp1_hooks, .fsdp2_hooks (--stack pytorch)  what
//       FullyShardedDataParallel and fully_shard add to a forward and to a
//       backward, their collectives included, on max(N, 2) ranks over Gloo
//       (processes, as a job runs them), FULL_SHARD or
//       reshard_after_forward=True (zero3) and SHARD_GRAD_OP or False
//       (zero2): a fixed cost, one a unit and one a parameter (the same
//       script);
//   measured_kernels.ddp_hooks, .ddp_buffers_s (--stack pytorch)  what
//       DistributedDataParallel adds to a forward and to a backward, its
//       all-reduces included, with gradient_as_bucket_view False ("copy")
//       and True ("view"): a fixed cost, one a bucket and one a parameter;
//       and what broadcasting a buffer adds to its forward (the same
//       script, on the same ranks);
//   measured_kernels.broadcast_s (--stack pytorch)  one dist.broadcast from
//       Python as ZeroRedundancyOptimizer issues them after its step, on
//       the same ranks;
//   gpu_link.latency_s  a gloo all-reduce of one element, the same way;
//   gpu_link.bytes_per_s  a gloo all-reduce of 16 MiB fp32 among max(N, 2)
//       ranks (threads of this process over loopback TCP), counted as the
//       time model counts a ring all-reduce: 2(n−1)/n × 16 MiB per rank; the
//       rate is the achieved one, so efficiency.collective becomes 1.
// Before any of it, glibc's malloc is put in a job's steady state
// (settle_malloc). Each figure is the median of its repetitions (at least
// 3, and 0.3 s). The
// efficiencies of compute and memory stay the base profile's estimates:
// they stand for what a training step reaches of these rates, which is what
// the report's step_time_error_pct then shows.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace shardfit::launch {

struct CalibrateRequest {
  int nproc = 1;             // ranks that will share this host's cores (as `run --nproc`)
  std::string base = "cpu";  // the profile whose other figures the result keeps
  std::string name = "cpu-calibrated";  // the result's profile name
  std::string profiles_dir;             // where `base` is looked up by name
  bool pytorch = false;                 // --stack pytorch: PyTorch's AdamW dispatch and FSDP's hooks too
};

// Measures this machine and returns `base`'s profile JSON with the measured
// figures, each with its source. `note` gets one line per figure as it is
// measured (the CLI prints them). Throws spec::BadInput when `base` is not a
// readable cpu profile, or (pytorch) the project's Python cannot run the
// probe.
nlohmann::json calibrate_cpu(const CalibrateRequest& request,
                             const std::function<void(const std::string&)>& note);

}  // namespace shardfit::launch
