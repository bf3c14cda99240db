// A candidate strategy: how state is sharded, whether it lives on the host,
// whether units recompute their forward in backward, the precision, and how
// modules are wrapped into units; and its id as SPEC.md spells it
// (`SHARDING[+offload][+ckpt]/PRECISION/wrap=POLICY`, e.g.
// `zero3+offload/fp32/wrap=size:2000`). Parsing accepts FSDP's names
// (`full_shard`, ...) as aliases; to_id() always prints the canonical form,
// so ids compare as strings. What a candidate *means* (what is sharded, what
// is gathered when) is decoded once, in spec/strategy.h.
#pragma once

#include <cstdint>
#include <string>

#include "spec/dtype.h"

namespace shardfit::spec {

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
  bool offload = false;    // params, grads, optimizer state on the host
  bool recompute = false;  // `+ckpt`: activation checkpointing of every wrapped unit
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
// The inverse: kF32 -> fp32, kF16 -> fp16, kBF16 -> bf16.
Precision precision_of(DType dtype);

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

// The text helpers the candidate parsers share (here and planner/candidate.cc's
// lists): ASCII lower case, and the string without surrounding white space.
std::string lower(std::string s);
std::string trim(const std::string& s);

}  // namespace shardfit::spec
