// The subcommands. Each registers its options on the CLI11 app and returns a
// function that runs it after parsing and returns the process exit code.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launch/child_process.h"
#include "launch/output_file.h"
#include "spec/errors.h"
#include "spec/exit_codes.h"

namespace shardfit::cli {

// SPEC's exit codes (spec/exit_codes.h).
using spec::kExitBadInput;
using spec::kExitCheckFailed;
using spec::kExitEnvironment;
using spec::kExitOk;
using spec::kExitOom;

// The failures a command ends with (spec/errors.h), caught by main.
using spec::BadInput;
using spec::EnvironmentFailure;
using spec::Interrupted;

// Output files (launch/output_file.h), for every command's --out.
using launch::check_output_file;
using launch::write_output_file;

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

std::vector<Command> make_commands(CLI::App& app);

// The command line as typed, for reports (set by main).
std::string& command_line();

// Each subcommand's registration (one file each).
Command add_models_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_validate_command(CLI::App& app);
Command add_export_config_command(CLI::App& app);
Command add_verify_command(CLI::App& app);
Command add_calibrate_command(CLI::App& app);

// This executable's path (/proc/self/exe), for spawning itself.
using launch::self_exe;

// Where the device profiles are: $SHARDFIT_PROFILES, else next to the binary.
std::string profiles_dir();

}  // namespace shardfit::cli
