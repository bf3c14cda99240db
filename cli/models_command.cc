// `shardfit models [--json]`: the built-in models with exact parameter counts.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "models/model_config.h"

namespace shardfit::cli {

Command add_models_command(CLI::App& app) {
  auto* sub = app.add_subcommand("models", "List the built-in models with exact parameter counts");
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "Print JSON instead of a table");
  return {sub, [json] {
            const auto& all = models::builtin_models();
            if (*json) {
              nlohmann::json out = nlohmann::json::array();
              for (const auto& m : all)
                out.push_back({{"name", m.name},
                               {"family", models::family_name(m.family)},
                               {"params", m.param_count()},
                               {"layers", m.layers},
                               {"hidden", m.hidden},
                               {"heads", m.heads},
                               {"kv_heads", m.kv_heads_or_heads()},
                               {"vocab_size", m.vocab_size},
                               {"max_positions", m.max_positions}});
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
