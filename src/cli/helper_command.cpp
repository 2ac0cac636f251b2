// Forwarding a subcommand to `tandem-torch` (Note [Two binaries]).
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli/commands.h"
#include "launch/install_layout.h"
#include "tandem/error.h"

namespace tandem::cli {

Command add_helper_command(CLI::App& app, const std::string& name, const std::string& description) {
  auto* sub = app.add_subcommand(name, description);
  sub->allow_extras();
  sub->set_help_flag();  // --help goes to the helper, which knows the flags
  return [sub, name]() -> int {
    const std::string helper = launch::install_path("libexec/tandem/tandem-torch");
    TANDEM_CHECK(::access(helper.c_str(), X_OK) == 0, "the helper ", helper, " that runs `tandem ", name,
                 "` is missing or not executable: reinstall Tandem (cmake --install)");
    std::vector<std::string> args{helper, name};
    for (const auto& extra : sub->remaining()) args.push_back(extra);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(helper.c_str(), argv.data());
    throw Error(message("cannot run ", helper, ": ", std::strerror(errno)));
  };
}

}  // namespace tandem::cli
