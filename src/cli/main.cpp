// moeserve: one binary, many subcommands (serve, generate, score, inspect, convert, ...).
// Each subcommand registers itself (src/cli/command.h); this file only dispatches and
// turns errors into a message on stderr and a non-zero exit code.
#include <algorithm>
#include <iostream>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace moeserve::cli {
std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace moeserve::cli

int main(int argc, char** argv) {
  using namespace moeserve;
  spdlog::set_default_logger(spdlog::stderr_color_mt("moeserve"));
  spdlog::set_pattern("%^[%H:%M:%S.%e %l]%$ %v");

  CLI::App app{"moeserve: an inference server for Mixture-of-Experts language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moeserve 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");

  auto& registry = cli::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::Runner> runners;
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    runners[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    log::set_level(log_level);
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
