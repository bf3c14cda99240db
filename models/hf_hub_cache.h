// A Hub id (`org/name`) found offline in the local Hugging Face cache, as
// huggingface_hub lays it out: $HF_HUB_CACHE, else $HF_HOME/hub, else
// ~/.cache/huggingface/hub, holding models--org--name/snapshots/<revision>/
// with refs/main naming the revision a download last resolved. Nothing is
// fetched: a model never downloaded is not found.
#pragma once

#include <optional>
#include <string>

namespace shardfit::models {

// Whether `id` has a Hub id's form: `org/name`, one slash, neither part
// empty or a dot path, and no `.json` ending.
bool looks_like_hub_id(const std::string& id);

// The cache directory searched (see above).
std::string hf_hub_cache_dir();

// The cached config.json of `id`: the snapshot refs/main names, else the
// only snapshot holding one; nullopt when none (or several and no refs/main).
std::optional<std::string> find_cached_hub_config(const std::string& id);

}  // namespace shardfit::models
