#pragma once
// The subcommands of the `tandem` binary; each registers its flags on the app and returns the
// function to run when it was chosen. Only binaries exit: library code throws tandem::Error.
#include <functional>

#include <CLI/CLI.hpp>

namespace tandem::cli {

using Command = std::function<int()>;

/// `tandem run` takes its worker command after `--`; main() splits the arguments there before
/// CLI11 sees them, so that nothing of the worker's is parsed (or reordered) as ours.
Command add_run_command(CLI::App& app, const std::vector<std::string>& after_separator);
Command add_env_command(CLI::App& app);

}  // namespace tandem::cli
