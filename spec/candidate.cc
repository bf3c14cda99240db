#include "spec/candidate.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace shardfit::spec {

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

Precision precision_of(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return Precision::kFp16;
    case DType::kBF16:
      return Precision::kBf16;
    case DType::kF32:
      break;
  }
  return Precision::kFp32;
}

std::string Candidate::to_id() const {
  std::string id = sharding_name(sharding);
  if (offload) id += "+offload";
  if (recompute) id += "+ckpt";
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
    bool* flag = mod == "offload" ? &c.offload : mod == "ckpt" ? &c.recompute : nullptr;
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

}  // namespace shardfit::spec
