#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

#include "cli/commands.h"
#include "tandem/error.h"

namespace tandem::cli {

int run_cli(CLI::App& app, int argc, char** argv,
            const std::function<std::vector<Command>(CLI::App&, const std::vector<std::string>&)>& add_commands) {
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
  std::vector<Command> commands = add_commands(app, after_separator);
  std::map<const CLI::App*, Command> by_subcommand;
  auto subcommands = app.get_subcommands({});
  for (size_t i = 0; i < subcommands.size() && i < commands.size(); ++i) by_subcommand[subcommands[i]] = commands[i];
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
    return by_subcommand.at(app.get_subcommands().front())();
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: unexpected error: %s\n", e.what());
    return 1;
  }
}

}  // namespace tandem::cli
