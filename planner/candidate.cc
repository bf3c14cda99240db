#include "planner/candidate.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

namespace shardfit::planner {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string join_names(const std::vector<Precision>& precisions) {
  std::string out;
  for (Precision p : precisions) out += (out.empty() ? "" : ", ") + std::string(precision_name(p));
  return out;
}

constexpr Sharding kAllShardings[] = {Sharding::kDdp, Sharding::kZero1, Sharding::kZero2,
                                      Sharding::kZero3, Sharding::kHybrid};
constexpr Precision kAllPrecisions[] = {Precision::kFp32, Precision::kFp16, Precision::kBf16};

// Why a (valid-looking) candidate cannot be run in this setting; "" if it can.
std::string infeasible_reason(const Candidate& c, const CandidateOptions& options) {
  if (c.sharding == Sharding::kDdp && c.offload)
    return "offload needs sharded state (use zero1, zero2 or zero3)";
  if (c.sharding == Sharding::kHybrid && options.nodes <= 1)
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
    if (offload && sharding == Sharding::kDdp) continue;
    for (bool ckpt : {false, true}) {
      for (Precision precision : precisions) {
        if (keeps_full_params(sharding)) {
          // Whole params on every rank: the wrap only picks what to
          // checkpoint, and checkpointing the root alone saves nothing.
          out->push_back({sharding, offload, ckpt, precision, ckpt ? "block" : "none"});
          continue;
        }
        for (const std::string& wrap : default_wrap_policies())
          out->push_back({sharding, offload, ckpt, precision, wrap});
      }
    }
  }
}

}  // namespace

const char* sharding_name(Sharding sharding) {
  switch (sharding) {
    case Sharding::kDdp:
      return "ddp";
    case Sharding::kZero1:
      return "zero1";
    case Sharding::kZero2:
      return "zero2";
    case Sharding::kZero3:
      return "zero3";
    case Sharding::kHybrid:
      return "hybrid";
  }
  return "?";
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

DType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kFp16:
      return DType::kF16;
    case Precision::kBf16:
      return DType::kBF16;
  }
  return DType::kF32;
}

bool keeps_full_params(Sharding sharding) {
  return sharding == Sharding::kDdp || sharding == Sharding::kZero1;
}

std::string Candidate::to_id() const {
  std::string id = sharding_name(sharding);
  if (offload) id += "+offload";
  if (ckpt) id += "+ckpt";
  id += "/";
  id += precision_name(precision);
  id += "/wrap=" + wrap;
  return id;
}

Sharding parse_sharding(const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "ddp" || s == "no_shard") return Sharding::kDdp;
  if (s == "zero1") return Sharding::kZero1;
  if (s == "zero2" || s == "shard_grad_op") return Sharding::kZero2;
  if (s == "zero3" || s == "full_shard") return Sharding::kZero3;
  if (s == "hybrid" || s == "hybrid_shard") return Sharding::kHybrid;
  throw std::invalid_argument("unknown sharding '" + text +
                              "' (use ddp|no_shard, zero1, zero2|shard_grad_op, "
                              "zero3|full_shard or hybrid|hybrid_shard)");
}

Precision parse_precision(const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "fp32") return Precision::kFp32;
  if (s == "fp16") return Precision::kFp16;
  if (s == "bf16") return Precision::kBf16;
  throw std::invalid_argument("unknown precision '" + text + "' (use fp32, fp16 or bf16)");
}

std::string parse_wrap(const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "none" || s == "block") return s;
  const std::string kSize = "size:";
  if (s.compare(0, kSize.size(), kSize) == 0) {
    std::string digits = s.substr(kSize.size());
    bool all_digits = !digits.empty() && digits.size() <= 18 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) {
                        return std::isdigit(static_cast<unsigned char>(c));
                      });
    if (all_digits) {
      long long n = std::stoll(digits);
      if (n > 0) return kSize + std::to_string(n);  // canonical: no leading zeros
    }
  }
  throw std::invalid_argument("unknown wrap policy '" + text +
                              "' (use none, block or size:N with N > 0 parameters)");
}

Candidate parse_candidate(const std::string& text) {
  auto fail = [&](const std::string& why) -> std::invalid_argument {
    return std::invalid_argument("bad candidate id '" + text + "': " + why +
                                 " (expected SHARDING[+offload][+ckpt]/PRECISION/wrap=POLICY, "
                                 "e.g. zero3+offload/fp32/wrap=size:2000)");
  };
  std::string s = trim(text);
  size_t slash1 = s.find('/');
  size_t slash2 = slash1 == std::string::npos ? slash1 : s.find('/', slash1 + 1);
  if (slash2 == std::string::npos || s.find('/', slash2 + 1) != std::string::npos)
    throw fail("needs exactly three '/'-separated parts");

  Candidate c;
  std::string head = s.substr(0, slash1);
  size_t plus = head.find('+');
  try {
    c.sharding = parse_sharding(head.substr(0, plus));
  } catch (const std::invalid_argument&) {
    throw fail("unknown sharding '" + head.substr(0, plus) +
               "' (ddp|no_shard, zero1, zero2|shard_grad_op, zero3|full_shard, "
               "hybrid|hybrid_shard)");
  }
  while (plus != std::string::npos) {
    size_t next = head.find('+', plus + 1);
    std::string mod =
        lower(head.substr(plus + 1, next == std::string::npos ? next : next - plus - 1));
    bool* flag = mod == "offload" ? &c.offload : mod == "ckpt" ? &c.ckpt : nullptr;
    if (!flag) throw fail("unknown modifier '+" + mod + "' (use +offload, +ckpt)");
    if (*flag) throw fail("modifier '+" + mod + "' given twice");
    *flag = true;
    plus = next;
  }

  std::string precision = s.substr(slash1 + 1, slash2 - slash1 - 1);
  try {
    c.precision = parse_precision(precision);
  } catch (const std::invalid_argument&) {
    throw fail("unknown precision '" + precision + "' (fp32, fp16, bf16)");
  }

  std::string wrap = s.substr(slash2 + 1);
  const std::string kWrap = "wrap=";
  if (lower(wrap).compare(0, kWrap.size(), kWrap) != 0)
    throw fail("third part '" + wrap + "' must start with 'wrap='");
  try {
    c.wrap = parse_wrap(wrap.substr(kWrap.size()));
  } catch (const std::invalid_argument&) {
    throw fail("unknown wrap policy '" + wrap.substr(kWrap.size()) +
               "' (none, block, size:N with N > 0)");
  }
  return c;
}

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
    if (sharding == Sharding::kHybrid && options.nodes <= 1) continue;
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
      if (sharding == Sharding::kHybrid && options.nodes <= 1)
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
