// Device profiles: what the planner knows about one accelerator (or CPU
// rank) before anything runs — its memory, the allocator that decides OOM on
// it, the memory taken outside that allocator, and the rates the time model
// turns bytes and FLOPs into seconds with. Profiles live as JSON under
// profiles/; every number in them carries a `sources` entry (datasheet,
// spec, or "estimate: why"), and the loader refuses a profile with a number
// that has none. This header also holds the two small parsers the CLI needs
// around profiles: sizes such as `24GiB` (for --gpu-mem) and finding the
// profiles directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "planner/model_trace.h"

namespace shardfit::planner {

enum class DeviceKind : uint8_t { kCuda, kCpu };

// Which allocator model decides OOM: PyTorch's CUDA caching allocator
// (reserved segments, rounding) or an exact byte count (the CPU tracking
// allocator).
enum class AllocatorKind : uint8_t { kCudaCaching, kExact };

// A data path and its rate. `bytes_per_s` is per direction per GPU: what one
// rank can push while every other rank pushes too, which is what a ring
// collective's per-rank traffic is divided by.
struct LinkSpec {
  std::string kind;  // e.g. "PCIe 3.0 x16", "NVLink 3 via NVSwitch"
  double bytes_per_s = 0;
  // A collective's fixed cost whatever its size (measured by `shardfit
  // calibrate`: gloo's round trips over loopback); 0 where not measured.
  double latency_s = 0;
};

// Fractions of the peak rates that real training reaches. All estimates
// (the profiles say so); the time model multiplies peaks by these.
struct ProfileEfficiency {
  double flops_fp32 = 0;   // of peak FP32 FLOP/s, for a transformer step
  double flops_fp16 = 0;   // of peak FP16 tensor FLOP/s (0 if unsupported)
  double flops_bf16 = 0;   // of peak BF16 tensor FLOP/s (0 if unsupported)
  double collective = 0;   // of the link rate, for a NCCL/gloo ring collective
  double host_link = 0;    // of the host link rate, for offload copies
  double memory = 0;       // of device memory bandwidth, for the optimizer step
  double host_memory = 0;  // of host memory bandwidth, for a CPU optimizer step
};

// Kernel rates measured on this machine by `shardfit calibrate`; datasheet
// profiles have none. With them the time model times a step op by op
// (planner/time_model.h) instead of dividing its FLOPs by one rate.
struct MeasuredKernels {
  double op_overhead_s = 0;  // one small kernel's dispatch, start to end
  // A grid of matrix products, every (m, n, k) with each in `matmul_dims`
  // (ascending); per dtype its rates, m-major: [(im·D + in)·D + ik].
  std::vector<int64_t> matmul_dims;
  std::map<DType, std::vector<double>> matmul_flops_per_s;
  // Compute-bound kernels (random numbers, transcendentals, reductions) per
  // dtype, by op name: the bytes they read and write per second, as the
  // trace counts them (KernelWork). Every other kernel runs at
  // memory_bytes_per_s.
  std::map<DType, std::map<std::string, double>> kernel_bytes_per_s;
  // What one torch.optim.AdamW step costs to dispatch on this machine,
  // whole (`shardfit calibrate --stack pytorch`: pytorch/calibrate_stack.py),
  // by step ("for-loop", "foreach", "fused") and by what its parameters are
  // ("tensor"; "dtensor": FSDP2's, each op through DTensor's Python
  // dispatch): fixed_s + per_tensor_s a tensor stepped + per_shape_s a
  // distinct shape among them (DTensor's propagation cache keys on the
  // for-loop step's step size, new each step: a miss a shape). Beside it
  // the step's bytes are timed at the memory bandwidth. Empty (a profile
  // calibrated without --stack pytorch): the step pays op_overhead_s per op
  // it runs.
  struct DispatchLine {
    double fixed_s = 0, per_tensor_s = 0, per_shape_s = 0;
  };
  std::map<std::string, std::map<std::string, DispatchLine>> adamw_steps;
  // The line for `step` over `tensor_kind`, or nullptr when not measured.
  const DispatchLine* adamw_step(const std::string& step, const std::string& tensor_kind) const;
  // What FSDP adds to a forward and to a backward on this machine, its
  // collectives included, as `shardfit calibrate --stack pytorch` ran it on
  // --nproc ranks (pytorch/calibrate_stack.py): by version (1:
  // FullyShardedDataParallel, 2: fully_shard), by sharding ("zero3":
  // FULL_SHARD, reshard_after_forward=True; "zero2": SHARD_GRAD_OP, False)
  // and by phase ("forward", "backward"), fixed_s + per_group_s a unit (a
  // flat parameter, a fully_shard group) + per_param_s a parameter. On a CPU
  // most of it is Python: each unit's hooks, the copies into and out of its
  // collectives, the wait for the other ranks. Empty: each collective pays
  // the link's latency alone.
  struct HookLine {
    double fixed_s = 0, per_group_s = 0, per_param_s = 0;
  };
  std::map<int, std::map<std::string, std::map<std::string, HookLine>>> fsdp_hooks;
  // The line of FSDP `version` for `sharding` in `phase`, or nullptr when not measured.
  const HookLine* fsdp_hook(int version, const std::string& sharding, const std::string& phase) const;
  // What DistributedDataParallel adds to a forward and to a backward on
  // this machine, its bucket all-reduces included, as `shardfit calibrate
  // --stack pytorch` ran it on --nproc ranks (the same script): by gradient
  // mode ("copy": gradient_as_bucket_view=False, PyTorch's default, each
  // gradient copied into its bucket and back; "view": True) and by phase,
  // fixed_s + per_group_s a bucket (the Reducer's, as rebuilt after the
  // first backward) + per_param_s a parameter (its autograd hook). Empty:
  // each bucket's all-reduce pays the link's latency alone.
  std::map<std::string, std::map<std::string, HookLine>> ddp_hooks;
  // The line of DDP's `mode` in `phase`, or nullptr when not measured.
  const HookLine* ddp_hook(const std::string& mode, const std::string& phase) const;
  // What broadcasting the module's buffers from rank 0 adds to a DDP
  // forward (broadcast_buffers=True, the default; none when the model has
  // no buffer); 0: not measured.
  double ddp_buffers_s = 0;
  // One dist.broadcast of a small tensor as ZeroRedundancyOptimizer's
  // _sync_params issues them after its step (async_op=True, each rank's
  // partition from it, then all waited for), from Python on --nproc Gloo
  // ranks (the same script); 0: not measured, each pays the link's latency.
  double broadcast_s = 0;
  bool times(DType dtype) const { return matmul_flops_per_s.count(dtype) > 0; }
  // The rate of one (m x k)(k x n) product: the grid's, interpolated
  // linearly in log(rate) over log(m), log(n), log(k), each clamped to the
  // grid (a product beyond it runs at its edge's rate).
  double matmul_rate(DType dtype, const GemmShape& g) const;
};

struct DeviceProfile {
  std::string name;         // "titan-rtx-24gb"
  std::string description;  // human words, for reports
  std::string path;         // the file it was loaded from
  DeviceKind kind = DeviceKind::kCuda;
  AllocatorKind allocator = AllocatorKind::kCudaCaching;

  // Total device memory as cudaMemGetInfo reports it; 0 = unlimited (CPU,
  // where the budget comes from --gpu-mem).
  int64_t memory_bytes = 0;

  // CUDA compute capability (8.0 = Ampere A100) and streaming
  // multiprocessors; 0 when the profile does not say. `--attention flash`
  // needs both: the kernel runs on 8.0 and later, and its forward splits
  // work by the SM count (models/attention.h).
  double compute_capability = 0;
  int64_t sm_count = 0;

  // Fixed overheads (the profile's sources say which were measured: the H200's).
  // The CUDA context and NCCL's buffers are cudaMalloc'ed outside the caching
  // allocator, so they shrink what it can reserve; NCCL's only exist when
  // world size > 1. cuBLAS's workspace goes through the caching allocator,
  // so it is an allocation the simulator charges, not a deduction.
  int64_t cuda_context_bytes = 0;
  int64_t cublas_workspace_bytes = 0;  // the sum of the allocations below
  // The workspaces as the allocator sees them, one block each (the profile
  // gives one number, or a list: on sm_90 with torch 2.11, 32 MiB cuBLAS +
  // 1 MiB cuBLASLt for the forward thread, 32 MiB for the autograd thread).
  std::vector<int64_t> cublas_workspace_allocations;
  int64_t nccl_buffers_bytes = 0;

  // Peak dense FLOP/s (no sparsity) per compute dtype; 0 = not supported
  // (no BF16 before Ampere).
  double fp32_flops_per_s = 0;
  double fp16_flops_per_s = 0;
  double bf16_flops_per_s = 0;

  double memory_bytes_per_s = 0;       // device memory bandwidth
  LinkSpec gpu_link;                   // GPU to GPU inside a node
  LinkSpec host_link;                  // device to host (offload copies)
  LinkSpec inter_node_link;            // between nodes, per GPU (an assumption)
  double host_memory_bytes_per_s = 0;  // host DRAM, for the CPU optimizer step
  ProfileEfficiency efficiency;
  MeasuredKernels measured_kernels;  // "measured_kernels", when calibrated

  // Dotted field path ("peak_flops_per_s.fp16") -> where the number came from.
  std::map<std::string, std::string> sources;

  bool supports(DType dtype) const { return peak_flops_per_s(dtype) > 0; }
  double peak_flops_per_s(DType dtype) const;
  double flops_efficiency(DType dtype) const;

  // What the caching allocator (or the exact allocator) may hold at most on
  // a device of `device_mem_bytes` (the profile's, or --gpu-mem's): the
  // total less the memory held outside the allocator. 0 stays 0 (unlimited).
  // Throws std::invalid_argument, showing the arithmetic, when the overheads
  // alone do not fit.
  int64_t allocator_budget_bytes(int64_t device_mem_bytes, int world_size) const;
};

// Loads a profile by name (looked up as `<profiles_dir>/<name>.json`) or by
// path (anything containing '/' or ending in ".json"). Throws
// std::invalid_argument with a one-line message: an unknown name lists the
// known profiles; a malformed file names the file and the field.
DeviceProfile load_profile(const std::string& name_or_path, const std::string& profiles_dir);

// Whether load_profile takes `name_or_path` as a path (it contains '/' or
// ends in ".json"), and the file it reads for it.
bool is_profile_path(const std::string& name_or_path);
std::string profile_file(const std::string& name_or_path, const std::string& profiles_dir);

// Parses a profile from JSON text; `origin` names it in error messages.
DeviceProfile parse_profile(const std::string& json_text, const std::string& origin);

// Names of the profiles in `profiles_dir` (file stems of *.json), sorted.
std::vector<std::string> list_profiles(const std::string& profiles_dir);

// The profiles directory: $SHARDFIT_PROFILES when set (it must exist), else
// the first of `candidate_dirs` that is a directory holding a *.json file.
// Throws std::invalid_argument naming the places it looked.
std::string find_profiles_dir(const std::vector<std::string>& candidate_dirs);

// The usual candidates for an executable at `exe_path` (e.g. from
// /proc/self/exe): <exe dir>/../profiles, <exe dir>/../share/shardfit/profiles,
// <exe dir>/../../profiles (a build tree inside the source tree). Callers
// append the source tree's profiles/ when they know it.
std::vector<std::string> default_profile_dirs(const std::string& exe_path);

// Parses a memory size: a number with an optional unit, binary (KiB, MiB,
// GiB, TiB) or decimal (B, KB, MB, GB, TB), case-insensitive, optional
// space: "24GiB", "512MiB", "1.5GB", "123456". Throws std::invalid_argument
// with a one-line message naming the text on anything else (negative, bare
// "G", a fraction of a byte, overflow).
int64_t parse_size_bytes(const std::string& text);

// "23.65 GiB": bytes as GiB with two decimals, for tables and messages.
std::string format_gib(int64_t bytes);
// Bytes in the binary unit that fits, two decimals: "23.65 GiB",
// "12.00 MiB" (MiB under 1 GiB), "600.00 KiB", "512 B".
std::string format_size(int64_t bytes);

}  // namespace shardfit::planner
