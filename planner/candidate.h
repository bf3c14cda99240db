// The candidates the planner sweeps: the default sweep with the
// --strategies / --precision filters applied. A candidate itself (its id,
// parsing, names) is the spec layer's (spec/candidate.h), and what it means
// is decoded once in spec/strategy.h; the planner uses both by these names.
#pragma once

#include <string>
#include <vector>

#include "planner/model_trace.h"
#include "spec/candidate.h"
#include "spec/strategy.h"

namespace shardfit::planner {

using spec::Candidate;
using spec::compute_dtype;
using spec::keeps_full_params;
using spec::parse_candidate;
using spec::parse_precision;
using spec::parse_sharding;
using spec::parse_wrap;
using spec::Precision;
using spec::precision_name;
using spec::Sharding;
using spec::sharding_name;

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
//    recomputation: one wrap, `none`, or `block` under +ckpt;
//  - hybrid only when nodes > 1.
// A full id in `strategies` is kept even when the sweep would not make it
// (e.g. wrap=size:5000). Throws std::invalid_argument (one line) for a bad
// item, a precision the device lacks, hybrid on one node, ddp+offload, or
// filters that leave nothing.
std::vector<Candidate> enumerate_candidates(const CandidateOptions& options);

// Splits "a,b , c" into {"a","b","c"}; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);

}  // namespace shardfit::planner
