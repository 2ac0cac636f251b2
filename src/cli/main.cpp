// `tandem`: run | env. Exit codes: 0 success, 1 a worker or the job failed, 2 bad input,
// 128+N stopped by signal N.
#include <cstdio>
#include <exception>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "tandem/error.h"
#include "tandem/version.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: data-parallel training for LibTorch C++ programs", "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + tandem::version());
  app.require_subcommand(1);
  std::vector<std::string> ours, after_separator;
  bool separated = false;
  for (int i = 1; i < argc; ++i) {
    if (!separated && std::string(argv[i]) == "--") {
      separated = true;
      continue;
    }
    (separated ? after_separator : ours).push_back(argv[i]);
  }

  std::map<const CLI::App*, tandem::cli::Command> commands;
  commands[nullptr] = nullptr;
  auto remember = [&](tandem::cli::Command command) {
    commands[app.get_subcommands({}).back()] = std::move(command);
  };
  remember(tandem::cli::add_run_command(app, after_separator));
  remember(tandem::cli::add_env_command(app));
  try {
    std::reverse(ours.begin(), ours.end());  // CLI11 takes the arguments in reverse order
    app.parse(ours);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "tandem: %s (see tandem %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands().front()->get_name() + " ").c_str());
    return 2;
  }
  try {
    return commands.at(app.get_subcommands().front())();
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: unexpected error: %s\n", e.what());
    return 1;
  }
}
