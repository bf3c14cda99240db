// docs/cli.md, written from the CLI's own definitions (`shardfit
// --help-markdown`, scripts/cli-docs): every subcommand and option with its
// value, default and help text, so the page cannot say what the CLI does not.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace shardfit::cli {

std::string help_markdown(CLI::App& app);

}  // namespace shardfit::cli
