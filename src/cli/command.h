// Subcommand registry. Each subcommand lives in its own src/cli/cmd_<name>.cpp and
// registers itself with a static Registrar, so adding one touches no shared file:
//
//   static moeserve::cli::Registrar reg{"score", "Teacher-forced logits", [](CLI::App& app) {
//     auto opts = std::make_shared<ScoreOptions>();
//     app.add_option(...);
//     return [opts] { return run_score(*opts); };   // returns the process exit code
//   }};
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace moeserve::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App&)>;

struct CommandSpec {
  std::string name;
  std::string description;
  Setup setup;
};

std::vector<CommandSpec>& command_registry();

struct Registrar {
  Registrar(std::string name, std::string description, Setup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace moeserve::cli
