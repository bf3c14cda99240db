#include "reports/machine.h"

#include "reports/json_whole.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardfit::reports {

const char* const kIsaFlagsThatMatter[] = {"avx2",     "avx512f",     "avx512bw", "avx512vl",
                                           "avx512dq", "avx512_bf16", "amx_bf16", nullptr};

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// sysfs writes cache sizes as "2048K" (or "1M").
int64_t parse_cache_size(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty()) return 0;
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(t, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = used < t.size() ? t[used] : ' ';
  if (unit == 'K') return n << 10;
  if (unit == 'M') return n << 20;
  return n;
}

}  // namespace

Machine machine_from_cpuinfo(const std::string& text) {
  Machine m;
  std::istringstream in(text);
  std::string line, flags;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "model name" && !have_model) m.cpu_model = value, have_model = true;
    if (key == "flags" && !have_flags) flags = " " + value + " ", have_flags = true;
  }
  for (int i = 0; kIsaFlagsThatMatter[i]; ++i)
    if (flags.find(std::string(" ") + kIsaFlagsThatMatter[i] + " ") != std::string::npos)
      m.isa_flags.push_back(kIsaFlagsThatMatter[i]);
  return m;
}

Machine this_machine(int threads_per_rank) {
  Machine m = machine_from_cpuinfo(read_text("/proc/cpuinfo"));
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    if (trim(read_text(dir + "level")) == "2" && trim(read_text(dir + "type")) != "Instruction") {
      m.l2_cache_bytes = parse_cache_size(read_text(dir + "size"));
      break;
    }
  }
  m.threads_per_rank = threads_per_rank;
  return m;
}

nlohmann::json to_json(const Machine& m) {
  nlohmann::json j = {{"cpu_model", m.cpu_model},
                      {"isa_flags", m.isa_flags},
                      {"l2_cache_bytes", m.l2_cache_bytes},
                      {"threads_per_rank", m.threads_per_rank}};
  if (!m.libtorch.empty()) j["libtorch"] = m.libtorch;
  return j;
}

Machine machine_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": machine is not an object");
  Machine m;
  try {
    m.cpu_model = j.at("cpu_model").get<std::string>();
    m.isa_flags = j.at("isa_flags").get<std::vector<std::string>>();
    m.l2_cache_bytes = json_whole<int64_t>(j.at("l2_cache_bytes"), where + ": machine.l2_cache_bytes");
    m.threads_per_rank = json_whole<int>(j.at("threads_per_rank"), where + ": machine.threads_per_rank");
    if (j.contains("libtorch")) m.libtorch = j.at("libtorch").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(where +
                                ": machine needs cpu_model, isa_flags, l2_cache_bytes and threads_per_rank");
  }
  return m;
}

std::string describe(const Machine& m) {
  std::string isa;
  for (const auto& f : m.isa_flags) isa += (isa.empty() ? "" : " ") + f;
  return (m.cpu_model.empty() ? std::string("unknown CPU") : m.cpu_model) + " (" +
         (isa.empty() ? std::string("no AVX2") : isa) + "; L2 " + std::to_string(m.l2_cache_bytes >> 10) +
         " KiB; " + std::to_string(m.threads_per_rank) + " thread(s)/rank" +
         (m.libtorch.empty() ? std::string() : "; LibTorch " + m.libtorch) + ")";
}

std::optional<std::string> speed_not_comparable(const std::optional<Machine>& a,
                                                const std::optional<Machine>& b) {
  if (!a || !b) return std::string("a report does not record its machine");
  if (a->cpu_model != b->cpu_model || a->isa_flags != b->isa_flags ||
      a->threads_per_rank != b->threads_per_rank || a->l2_cache_bytes != b->l2_cache_bytes ||
      (!a->libtorch.empty() && !b->libtorch.empty() && a->libtorch != b->libtorch))
    return "measured on " + describe(*a) + ", baseline on " + describe(*b);
  return std::nullopt;
}

}  // namespace shardfit::reports
