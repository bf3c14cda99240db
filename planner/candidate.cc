#include "planner/candidate.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

namespace shardfit::planner {
namespace {

using spec::lower;
using spec::trim;

std::string join_names(const std::vector<Precision>& precisions) {
  std::string out;
  for (Precision p : precisions) out += (out.empty() ? "" : ", ") + std::string(precision_name(p));
  return out;
}

constexpr Sharding kAllShardings[] = {Sharding::kDdp, Sharding::kZero1, Sharding::kZero2,
                                      Sharding::kZero3, Sharding::kHybrid};
constexpr Precision kAllPrecisions[] = {Precision::kFp32, Precision::kFp16, Precision::kBf16};

// Why a (valid-looking) candidate cannot be run in this setting; "" if it can.
// The strategy's own rules are spec's validator; hybrid on one node (where it
// is zero3) and the device's precisions are the sweep's.
std::string infeasible_reason(const Candidate& c, const CandidateOptions& options) {
  const std::string problem = spec::candidate_problem(c);
  if (!problem.empty()) return problem;
  if (spec::sharding_traits(c.sharding).replicate_across_groups && options.nodes <= 1)
    return "hybrid needs --nodes > 1 (on one node it is zero3)";
  const auto& supported = options.supported_precisions;
  if (std::find(supported.begin(), supported.end(), c.precision) == supported.end()) {
    return std::string(precision_name(c.precision)) + " is not supported by " +
           (options.device_name.empty() ? std::string("the device") : options.device_name) +
           " (supported: " + join_names(supported) + ")";
  }
  return "";
}

// The default sweep for one sharding, before precision filtering.
void sweep_sharding(Sharding sharding, const std::vector<Precision>& precisions,
                    std::vector<Candidate>* out) {
  for (bool offload : {false, true}) {
    if (!spec::candidate_problem({sharding, offload}).empty()) continue;  // ddp+offload
    for (bool recompute : {false, true}) {
      for (Precision precision : precisions) {
        if (keeps_full_params(sharding)) {
          // Whole params on every rank: the wrap only picks what to
          // recompute, and recomputing the root alone saves nothing.
          out->push_back({sharding, offload, recompute, precision, recompute ? "block" : "none"});
          continue;
        }
        for (const std::string& wrap : default_wrap_policies())
          out->push_back({sharding, offload, recompute, precision, wrap});
      }
    }
  }
}

}  // namespace

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string::npos) comma = text.size();
    std::string item = trim(text.substr(begin, comma - begin));
    if (!item.empty()) items.push_back(item);
    begin = comma + 1;
  }
  return items;
}

std::vector<Candidate> enumerate_candidates(const CandidateOptions& options) {
  // --precision: which precisions to keep. "all" (or nothing) = every one the
  // device supports; naming one it lacks is an error, not a silent empty plan.
  std::vector<Precision> precisions;
  bool all_precisions = options.precisions.empty();
  for (const std::string& item : options.precisions) {
    if (lower(trim(item)) == "all") {
      all_precisions = true;
      continue;
    }
    Precision p = parse_precision(item);
    Candidate probe;
    probe.precision = p;
    std::string why = infeasible_reason(probe, options);
    if (!why.empty()) throw std::invalid_argument("--precision " + item + ": " + why);
    if (std::find(precisions.begin(), precisions.end(), p) == precisions.end())
      precisions.push_back(p);
  }
  if (all_precisions) {
    precisions.clear();
    for (Precision p : kAllPrecisions) {
      const auto& supported = options.supported_precisions;
      if (std::find(supported.begin(), supported.end(), p) != supported.end())
        precisions.push_back(p);
    }
  }
  auto precision_kept = [&](Precision p) {
    return std::find(precisions.begin(), precisions.end(), p) != precisions.end();
  };

  std::vector<Candidate> swept;
  for (Sharding sharding : kAllShardings) {
    if (spec::sharding_traits(sharding).replicate_across_groups && options.nodes <= 1) continue;
    sweep_sharding(sharding, precisions, &swept);
  }
  if (options.strategies.empty()) {
    if (swept.empty()) throw std::invalid_argument("no candidate strategies to plan");
    return swept;
  }

  // --strategies: a sharding name keeps its part of the sweep; a full id is
  // kept as given (canonicalized), even outside the sweep.
  std::vector<Candidate> out;
  std::set<std::string> seen;
  auto add = [&](const Candidate& c) {
    if (seen.insert(c.to_id()).second) out.push_back(c);
  };
  for (const std::string& item : options.strategies) {
    if (item.find('/') == std::string::npos) {
      Sharding sharding;
      try {
        sharding = parse_sharding(item);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument("--strategies item '" + item +
                                    "' is neither a sharding name nor a candidate id "
                                    "(e.g. zero3 or zero3+offload/fp32/wrap=size:2000)");
      }
      if (spec::sharding_traits(sharding).replicate_across_groups && options.nodes <= 1)
        throw std::invalid_argument("--strategies " + item +
                                    ": hybrid needs --nodes > 1 (on one node it is zero3)");
      for (const Candidate& c : swept)
        if (c.sharding == sharding) add(c);
      continue;
    }
    Candidate c = parse_candidate(item);
    std::string why = infeasible_reason(c, options);
    if (!why.empty()) throw std::invalid_argument("--strategies " + item + ": " + why);
    if (!precision_kept(c.precision)) {
      throw std::invalid_argument("--strategies " + item + " has precision " +
                                  precision_name(c.precision) + ", which --precision excludes");
    }
    add(c);
  }
  if (out.empty()) throw std::invalid_argument("no candidate matches --strategies and --precision");
  return out;
}

}  // namespace shardfit::planner
