// The machine a run was measured on: what a run report records so that a
// later check compares only like with like. Memory on the CPU is a function
// of the code and, for bf16, of the ISA, the L2 cache and the threads per
// rank (oneDNN sizes its matmul scratchpads by them, docs/accuracy.md); speed is a
// function of the whole machine. A baseline made on one machine is a memory
// reference everywhere its memory fingerprint matches, and a speed reference
// only on the same machine. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardfit::reports {

struct Machine {
  std::string cpu_model;               // /proc/cpuinfo "model name"
  std::vector<std::string> isa_flags;  // the kIsaFlagsThatMatter this CPU has, in that order
  int64_t l2_cache_bytes = 0;          // per core (sysfs cache index 2)
  int threads_per_rank = 0;            // intra-op threads each rank ran with
  // The LibTorch it trained with (its TORCH_VERSION, set by the caller: no
  // LibTorch here); empty in reports written before it was recorded.
  std::string libtorch;
};

// The CPU flags that change which kernels LibTorch 1.13 and its oneDNN pick
// for our ops: AVX2/AVX-512 for fp32 and the bf16 matmul path (ideep takes
// bf16 to oneDNN only with AVX-512 BW, VL and DQ), AVX-512 bf16 and AMX for
// the bf16 kernels themselves.
extern const char* const kIsaFlagsThatMatter[];

// Reads /proc/cpuinfo and sysfs; fields it cannot read stay empty or 0.
Machine this_machine(int threads_per_rank);
// Parses /proc/cpuinfo's text (the model name and flags of its first CPU).
Machine machine_from_cpuinfo(const std::string& cpuinfo_text);

nlohmann::json to_json(const Machine& m);
// Throws std::invalid_argument naming `where` and the field.
Machine machine_from_json(const nlohmann::json& j, const std::string& where);
// "Intel(R) Xeon(R) ... (avx2 avx512f ... amx_bf16; L2 2 MiB; 1 thread/rank)"
std::string describe(const Machine& m);

// Why a throughput figure measured on `a` cannot be compared with one from
// `b` (another CPU model, ISA or thread count), or nullopt when it can.
std::optional<std::string> speed_not_comparable(const std::optional<Machine>& a,
                                                const std::optional<Machine>& b);

}  // namespace shardfit::reports
