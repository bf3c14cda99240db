#include "executor/slurm_env.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace shardfit::executor {
namespace {

// Splits on commas outside brackets.
std::vector<std::string> split_top(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw std::invalid_argument("hostlist '" + text + "': unbalanced ']'");
    if (c == ',' && depth == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw std::invalid_argument("hostlist '" + text + "': unbalanced '['");
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// A job of more hosts than this is no job (plan's --nodes bound); the
// expansion stops there instead of listing every name of a typo's range.
constexpr size_t kMaxHosts = 65536;

// One name, maybe with bracket groups: expand the first, recurse on the rest.
void expand_name(const std::string& name, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (out.size() >= kMaxHosts)
      throw std::invalid_argument("hostlist '" + whole + "': more than " + std::to_string(kMaxHosts) + " hosts");
    out.push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  if (close == std::string::npos)
    throw std::invalid_argument("hostlist '" + whole + "': unbalanced '['");
  const std::string prefix = name.substr(0, open), rest = name.substr(close + 1);
  std::string items = name.substr(open + 1, close - open - 1) + ",";
  for (size_t start = 0, comma; (comma = items.find(',', start)) != std::string::npos;
       start = comma + 1) {
    const std::string item = items.substr(start, comma - start);
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash),
                      hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      throw std::invalid_argument("hostlist '" + whole + "': '" + item +
                                  "' is not a number or a range");
    if (lo.size() > 9 || hi.size() > 9)  // std::stol's range, and more hosts than any job
      throw std::invalid_argument("hostlist '" + whole + "': '" + item + "' is past any host number");
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a)
      throw std::invalid_argument("hostlist '" + whole + "': range '" + item + "' runs backwards");
    for (long v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits = std::string(lo.size() - digits.size(), '0') + digits;
      expand_name(prefix + digits + rest, whole, out);
    }
  }
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Slurm's counts and ids here (tasks, ranks, nodes, job id): whole numbers
// read exactly, never wrapped (SLURM_NTASKS=99999999999 once read as
// 1215752191). 2^31 - 1 bounds them all; the world's own bound is the
// engine's.
int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  const std::string text(v);
  if (!all_digits(text) || text.size() > 10 || std::stoll(text) > 2147483647)
    throw std::invalid_argument(std::string(name) + "='" + text + "': expected a whole number up to 2147483647");
  return static_cast<int>(std::stoll(text));
}

// SLURM_TASKS_PER_NODE's first entry: "2(x3),1" -> 2.
int first_tasks_per_node(const char* text) {
  std::string s(text);
  const size_t end = s.find_first_of("(,");
  const std::string n = s.substr(0, end);
  return all_digits(n) ? std::atoi(n.c_str()) : 0;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& name : split_top(text)) expand_name(name, text, out);
  return out;
}

bool apply_slurm_env() {
  if (!env("SLURM_PROCID") || !env("SLURM_NTASKS") || env("RANK")) return false;
  const int rank = env_int("SLURM_PROCID", 0);
  const int world = env_int("SLURM_NTASKS", 1);
  if (world < 1 || rank >= world)
    throw std::invalid_argument("SLURM_PROCID=" + std::to_string(rank) +
                                " is outside SLURM_NTASKS=" + std::to_string(world));
  const int local_rank = env_int("SLURM_LOCALID", 0);
  int local_world = 0;
  if (const char* per_node = env("SLURM_STEP_TASKS_PER_NODE"))
    local_world = first_tasks_per_node(per_node);
  if (local_world <= 0)
    if (const char* per_node = env("SLURM_TASKS_PER_NODE"))
      local_world = first_tasks_per_node(per_node);
  if (local_world <= 0) local_world = world / std::max(1, env_int("SLURM_NNODES", 1));
  local_world = std::max(local_world, local_rank + 1);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  if (!env("LOCAL_RANK")) ::setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  if (!env("LOCAL_WORLD_SIZE"))
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(local_world).c_str(), 1);
  if (!env("MASTER_ADDR")) {
    const char* list = env("SLURM_STEP_NODELIST");
    const char* which = "SLURM_STEP_NODELIST";
    if (!list) list = env("SLURM_JOB_NODELIST"), which = "SLURM_JOB_NODELIST";
    if (!list) list = env("SLURM_NODELIST"), which = "SLURM_NODELIST";
    if (!list)
      throw std::invalid_argument(
          "SLURM_NODELIST: unset, and MASTER_ADDR is unset too (set MASTER_ADDR to rank 0's host)");
    std::vector<std::string> hosts;
    try {
      hosts = expand_hostlist(list);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(which) + ": " + e.what());
    }
    if (hosts.empty())
      throw std::invalid_argument(std::string(which) + ": no host in '" + list + "'");
    ::setenv("MASTER_ADDR", hosts.front().c_str(), 1);
  }
  if (!env("MASTER_PORT"))
    ::setenv("MASTER_PORT", std::to_string(29500 + env_int("SLURM_JOB_ID", 0) % 1000).c_str(), 1);
  return true;
}

}  // namespace shardfit::executor
