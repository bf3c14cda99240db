#include "cli/help_markdown.h"

#include <sstream>

namespace shardfit::cli {
namespace {

// A table cell: '|' would end it, a newline would end the row.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

// One table of an app's own options (its help flags and hidden options
// left out: CLI11 hides an option whose group is empty).
void options_table(std::ostringstream& md, const CLI::App& app) {
  std::ostringstream rows;
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name(false, true);
    if (opt->get_group().empty() || name.find("--help") != std::string::npos) continue;
    std::string value = opt->get_expected_min() == 0 ? "flag" : opt->get_type_name();
    if (!opt->get_default_str().empty()) value += " (default " + opt->get_default_str() + ")";
    rows << "| `" << (opt->nonpositional() ? name : opt->get_name(true)) << "` | " << cell(value) << " | "
         << cell(opt->get_description()) << " |\n";
  }
  if (rows.str().empty()) return;
  md << "| option | value | what it does |\n|---|---|---|\n" << rows.str();
}

}  // namespace

std::string help_markdown(CLI::App& app) {
  std::ostringstream md;
  md << "# Commands and options\n\n"
     << "Written by `scripts/cli-docs` from the CLI's own definitions (`shardfit --help-markdown`); "
        "`ctest -R CliDocs` fails when this page and the CLI differ. `shardfit COMMAND --help` prints "
        "the same.\n\n"
     << cell(app.get_description()) << "\n\n## Options of every command\n\n";
  options_table(md, app);
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    md << "\n## `shardfit " << sub->get_name() << "`\n\n" << cell(sub->get_description()) << "\n\n";
    options_table(md, *sub);
    if (!sub->get_footer().empty() && sub->get_footer() != app.get_footer()) md << "\n" << sub->get_footer() << "\n";
  }
  if (!app.get_footer().empty()) md << "\n" << app.get_footer() << "\n";
  return md.str();
}

}  // namespace shardfit::cli
