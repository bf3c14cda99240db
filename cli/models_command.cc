// `shardfit models [MODEL] [--json | --hf-config]`: the built-in models with
// exact parameter counts, or what shardfit builds from one (a built-in name,
// or a Hugging Face config.json, a model directory holding one or a Hub id),
// or that model's config.json as transformers reads it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "models/hf_architecture.h"
#include "models/model_config.h"

namespace shardfit::cli {
namespace {

nlohmann::json describe(const models::ModelConfig& m) {
  nlohmann::json j = {{"name", m.name},
                      {"family", models::family_name(m.family)},
                      {"params", m.param_count()},
                      {"layers", m.layers},
                      {"hidden", m.hidden},
                      {"heads", m.heads},
                      {"kv_heads", m.kv_heads_or_heads()},
                      {"vocab_size", m.vocab_size},
                      {"max_positions", m.max_positions}};
  return j;
}

int describe_one(const std::string& path, bool json, bool hf_config) {
  models::ModelConfig m;
  try {
    m = models::resolve_model(path);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  if (hf_config) {  // what `plan --stack pytorch` traces for it, and `run --export` writes
    std::cout << models::to_hf_config(m).dump(2) << "\n";
    return kExitOk;
  }
  const models::HfArchitecture& arch = models::architecture_of(m);
  nlohmann::json j = describe(m);
  j["architecture"] = arch.name;
  j["block_class"] = arch.block_class;
  j["intermediate"] = m.intermediate;
  j["activation"] = m.activation;
  if (m.family == models::Family::kGpt2) j["tie_word_embeddings"] = m.tie_word_embeddings;
  if (m.family == models::Family::kBert && !m.masked_lm()) j["num_labels"] = m.num_labels;
  if (m.masked_lm()) j["tie_word_embeddings"] = m.tie_word_embeddings;
  if (json) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  for (const auto& [k, v] : j.items())
    std::cout << k << std::string(k.size() < 20 ? 20 - k.size() : 1, ' ')
              << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  return kExitOk;
}

}  // namespace

Command add_models_command(CLI::App& app) {
  auto* sub = app.add_subcommand("models",
                                 "List the built-in models with exact parameter counts, or "
                                 "describe one config.json / model dir");
  auto json = std::make_shared<bool>(false);
  auto hf_config = std::make_shared<bool>(false);
  auto path = std::make_shared<std::string>();
  sub->add_option("MODEL", *path,
                  "A built-in name, a Hugging Face config.json, a model directory holding one, or a Hub id");
  auto* json_flag = sub->add_flag("--json", *json, "Print JSON instead of a table");
  sub->add_flag("--hf-config", *hf_config,
                "Print MODEL's config.json as transformers reads it: what plan --stack pytorch traces for a "
                "built-in and run --export writes beside the weights")
      ->excludes(json_flag);
  return {sub, [json, hf_config, path] {
            if (*hf_config && path->empty()) throw BadInput("models --hf-config: name the MODEL");
            if (!path->empty()) return describe_one(*path, *json, *hf_config);
            const auto& all = models::builtin_models();
            if (*json) {
              nlohmann::json out = nlohmann::json::array();
              for (const auto& m : all) out.push_back(describe(m));
              std::cout << out.dump(2) << "\n";
              return kExitOk;
            }
            std::printf("%-13s %-6s %15s %7s %7s %6s %7s %9s\n", "name", "family", "params",
                        "layers", "hidden", "heads", "vocab", "positions");
            for (const auto& m : all)
              std::printf("%-13s %-6s %15lld %7lld %7lld %6lld %7lld %9lld\n", m.name.c_str(),
                          models::family_name(m.family), static_cast<long long>(m.param_count()),
                          static_cast<long long>(m.layers), static_cast<long long>(m.hidden),
                          static_cast<long long>(m.heads), static_cast<long long>(m.vocab_size),
                          static_cast<long long>(m.max_positions));
            return kExitOk;
          }};
}

}  // namespace shardfit::cli
