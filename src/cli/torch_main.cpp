// `tandem-torch`: the subcommands of `tandem` that need LibTorch (Note [Two binaries]).
#include "cli/commands.h"
#include "tandem/version.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem's LibTorch subcommands (started by `tandem`)", "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + tandem::version());
  return tandem::cli::run_cli(app, argc, argv, [](CLI::App& a, const std::vector<std::string>&) {
    return std::vector<tandem::cli::Command>{tandem::cli::add_env_command(a), tandem::cli::add_checkpoint_command(a)};
  });
}
