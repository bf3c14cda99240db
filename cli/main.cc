// shardfit: the command-line front end. Each subcommand parses its options
// with CLI11 and hands off to a library; this file owns the exit-code
// contract (SPEC): 0 done, 1 the job's check failed, 2 bad input (one line
// on stderr naming the input), 3 the environment failed, 4 `run` went out of
// memory (report written; --oom-ok makes it 0). Results go to stdout, logs
// to stderr (--log-level, --quiet).
#include <cctype>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/help_markdown.h"
#include "cli/progress.h"

namespace {

// `arg` as one shell word: as is when it is plain, else single-quoted.
std::string shell_word(const std::string& arg) {
  bool plain = !arg.empty();
  for (char ch : arg)
    plain = plain && (std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("-_./:=,+@%", ch));
  if (plain) return arg;
  std::string q = "'";
  for (char ch : arg) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardfit::cli;
  CLI::App app{"shardfit: plan, run and check sharded data-parallel training memory",
               "shardfit"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  std::string log_level = "info";
  bool quiet = false;
  app.add_option("--log-level", log_level, "Logs on stderr: trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_flag("--quiet,-q", quiet, "Only warnings and errors on stderr (results still on stdout)");
  app.set_version_flag("--version", version_text(), "Print the version, LibTorch's, and CUDA/NCCL support");
  app.footer(
      "Exit codes: 0 done, 1 a check failed, 2 bad input (one line on stderr naming it), 3 the "
      "environment failed, 4 `run` went out of memory (report written; --oom-ok makes it 0).");
  app.fallthrough();  // --quiet and --log-level also after the subcommand
  std::vector<Command> commands = make_commands(app);
  if (argc == 2 && std::strcmp(argv[1], "--help-markdown") == 0) {  // docs/cli.md (scripts/cli-docs)
    std::cout << help_markdown(app);
    return kExitOk;
  }
  command_line() = "shardfit";
  for (int i = 1; i < argc; ++i) command_line() += " " + shell_word(argv[i]);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const auto& c : commands) {
      known = known || c.app->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + c.app->get_name();
    }
    if (!known) {
      std::cerr << "shardfit: error: unknown subcommand '" << argv[1] << "' (" << names << ")\n";
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, naming the input: CLI11's message already quotes the option.
    std::string what = e.what();
    for (auto& c : what) if (c == '\n') c = ' ';
    std::cerr << "shardfit: error: " << what << "\n";
    return kExitBadInput;
  }
  try {
    configure_logging(log_level, quiet);
  } catch (const std::invalid_argument& e) {
    std::cerr << "shardfit: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  for (auto& c : commands) {
    if (!c.app->parsed()) continue;
    try {
      return c.run();
    } catch (const BadInput& e) {
      std::cerr << "shardfit " << c.app->get_name() << ": error: " << e.what() << "\n";
      return kExitBadInput;
    } catch (const std::invalid_argument& e) {
      std::cerr << "shardfit " << c.app->get_name() << ": error: " << e.what() << "\n";
      return kExitBadInput;
    } catch (const Interrupted& e) {
      std::cerr << "shardfit " << c.app->get_name() << ": " << e.what() << "\n";
      return 128 + e.signal;
    } catch (const EnvironmentFailure& e) {
      std::cerr << "shardfit " << c.app->get_name() << ": failed: " << e.what() << "\n";
      return kExitEnvironment;
    } catch (const std::exception& e) {
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      std::cerr << "shardfit " << c.app->get_name() << ": internal error: " << what << "\n";
      return kExitEnvironment;
    }
  }
  return kExitBadInput;
}
