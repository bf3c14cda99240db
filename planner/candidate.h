// Candidate strategies: one point in the space the planner sweeps (how state
// is sharded, whether it lives on the host, whether units are checkpointed,
// the precision, and how modules are wrapped into units), its id as SPEC.md
// spells it (`SHARDING[+offload][+ckpt]/PRECISION/wrap=POLICY`, e.g.
// `zero3+offload/fp32/wrap=size:2000`), and the default sweep with the
// --strategies / --precision filters applied. Parsing accepts FSDP's names
// (`full_shard`, ...) as aliases; to_id() always prints the canonical form,
// so ids compare as strings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/model_trace.h"

namespace shardfit::planner {

enum class Sharding : uint8_t {
  kDdp,     // replicated params, grads, optimizer; all-reduce of grads
  kZero1,   // optimizer state sharded
  kZero2,   // + gradients sharded (FSDP SHARD_GRAD_OP)
  kZero3,   // + parameters sharded (FSDP FULL_SHARD)
  kHybrid,  // zero3 inside a node, replicas across nodes (HYBRID_SHARD)
};

// fp16 / bf16 are mixed precision: low-precision compute and gradient
// reduction, fp32 master weights and optimizer state.
enum class Precision : uint8_t { kFp32, kFp16, kBf16 };

struct Candidate {
  Sharding sharding = Sharding::kDdp;
  bool offload = false;  // params, grads, optimizer state on the host
  bool ckpt = false;     // activation checkpointing of every wrapped unit
  Precision precision = Precision::kFp32;
  std::string wrap = "none";  // "none", "block" or "size:N" (canonical)

  // The canonical id: "zero3+offload+ckpt/bf16/wrap=size:2000".
  std::string to_id() const;
  bool operator==(const Candidate& o) const { return to_id() == o.to_id(); }
};

// Canonical names, as they appear in ids and in plan JSON.
const char* sharding_name(Sharding sharding);     // "ddp", "zero1", ...
const char* precision_name(Precision precision);  // "fp32", "fp16", "bf16"
// The dtype the model computes and reduces gradients in.
DType compute_dtype(Precision precision);

// Name or alias (case-insensitive) -> Sharding: ddp|no_shard, zero1,
// zero2|shard_grad_op, zero3|full_shard, hybrid|hybrid_shard. Throws
// std::invalid_argument listing the accepted names.
Sharding parse_sharding(const std::string& text);
// fp32 | fp16 | bf16. Throws std::invalid_argument.
Precision parse_precision(const std::string& text);
// none | block | size:N (N a positive integer) -> canonical text. Throws
// std::invalid_argument.
std::string parse_wrap(const std::string& text);

// Parses a full id; modifiers may come in either order. Throws
// std::invalid_argument with one line naming the text and the bad part.
Candidate parse_candidate(const std::string& text);

// Whether the sharding leaves the parameters whole on each rank between
// steps (so the wrap policy only decides checkpointing, not memory).
bool keeps_full_params(Sharding sharding);

struct CandidateOptions {
  // --strategies, split on commas: full ids or sharding names (a name keeps
  // every swept candidate of that sharding). Empty = everything.
  std::vector<std::string> strategies;
  // --precision, split on commas: fp32, fp16, bf16 or all. Empty = all.
  std::vector<std::string> precisions;
  // What the device can compute in (from its profile); named in errors.
  std::vector<Precision> supported_precisions = {Precision::kFp32};
  std::string device_name;
  int nodes = 1;  // hybrid is only swept, and only allowed, with nodes > 1
};

// The size thresholds of the default sweep: FSDP's `min_num_params` values
// the reference write-up compared.
inline const std::vector<std::string>& default_wrap_policies() {
  static const std::vector<std::string> kPolicies = {"none", "block", "size:1000000", "size:2000"};
  return kPolicies;
}

// The default sweep filtered by `options`, in a stable order (sharding,
// offload, ckpt, precision, wrap), without duplicates:
//  - every sharding × offload × ckpt × supported precision × wrap policy;
//  - no offload for ddp (offload needs sharded state);
//  - ddp and zero1 keep whole params on every rank, so units only matter for
//    checkpointing: one wrap, `none`, or `block` under +ckpt;
//  - hybrid only when nodes > 1.
// A full id in `strategies` is kept even when the sweep would not make it
// (e.g. wrap=size:5000). Throws std::invalid_argument (one line) for a bad
// item, a precision the device lacks, hybrid on one node, ddp+offload, or
// filters that leave nothing.
std::vector<Candidate> enumerate_candidates(const CandidateOptions& options);

// Splits "a,b , c" into {"a","b","c"}; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);

}  // namespace shardfit::planner
