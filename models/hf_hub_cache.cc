#include "models/hf_hub_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace shardfit::models {
namespace fs = std::filesystem;

bool looks_like_hub_id(const std::string& id) {
  const auto slash = id.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == id.size()) return false;
  if (id.find('/', slash + 1) != std::string::npos) return false;
  if (id[0] == '.' || id[0] == '~') return false;
  return id.size() < 5 || id.substr(id.size() - 5) != ".json";
}

std::string hf_hub_cache_dir() {
  // huggingface_hub/constants.py: HF_HUB_CACHE, else HF_HOME/hub, HF_HOME
  // defaulting to ~/.cache/huggingface.
  if (const char* hub = std::getenv("HF_HUB_CACHE"); hub && *hub) return hub;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return (fs::path(home) / "hub").string();
  const char* user = std::getenv("HOME");
  return (fs::path(user ? user : ".") / ".cache" / "huggingface" / "hub").string();
}

std::optional<std::string> find_cached_hub_config(const std::string& id) {
  if (!looks_like_hub_id(id)) return std::nullopt;
  const auto slash = id.find('/');
  const fs::path repo = fs::path(hf_hub_cache_dir()) /
                        ("models--" + id.substr(0, slash) + "--" + id.substr(slash + 1));
  const fs::path snapshots = repo / "snapshots";
  std::error_code ec;
  std::string revision;
  if (std::ifstream ref(repo / "refs" / "main"); ref) std::getline(ref, revision);
  if (!revision.empty() && fs::is_regular_file(snapshots / revision / "config.json", ec))
    return (snapshots / revision / "config.json").string();
  std::vector<fs::path> found;
  for (fs::directory_iterator it(snapshots, ec), end; !ec && it != end; it.increment(ec))
    if (fs::is_regular_file(it->path() / "config.json", ec)) found.push_back(it->path() / "config.json");
  if (found.size() == 1) return found[0].string();
  return std::nullopt;
}

}  // namespace shardfit::models
