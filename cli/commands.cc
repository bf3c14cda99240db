#include "cli/commands.h"

namespace shardfit::cli {

std::string& command_line() {
  static std::string line;
  return line;
}

std::vector<Command> make_commands(CLI::App& app) {
  return {add_models_command(app), add_plan_command(app), add_run_command(app),
          add_validate_command(app), add_compare_command(app), add_report_command(app),
          add_export_config_command(app), add_verify_command(app), add_calibrate_command(app)};
}

}  // namespace shardfit::cli
