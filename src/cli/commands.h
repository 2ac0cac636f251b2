#pragma once
// The subcommands of the `tandem` binaries; each registers its flags on the app and returns the
// function to run when it was chosen. Only binaries exit: library code throws tandem::Error.
//
// Note [Two binaries]
// `tandem` itself links no LibTorch: `tandem run` starts workers that load LibTorch themselves,
// and a launcher that paid 0.4 s and 450 MiB for libraries it never uses would delay every
// launch and restart. Subcommands that need LibTorch (`env`) live in the helper `tandem-torch`
// (installed in libexec/tandem/), which `tandem` executes in its place.
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launch/launch_options.h"

namespace tandem::cli {

using Command = std::function<int()>;

/// `tandem run` takes its worker command after `--`; main() splits the arguments there before
/// CLI11 sees them, so that nothing of the worker's is parsed (or reordered) as ours.
Command add_run_command(CLI::App& app, const std::vector<std::string>& after_separator);
/// add_run_command's parsing alone: registers the same `run` flags; the returned function, once
/// app.parse() chose `run`, gives the options as parsed (worker command assembled, grace period
/// converted), before launch::resolve. Throws tandem::Error. Starts and probes nothing (the CLI
/// fuzzer's entry point).
std::function<launch::LaunchOptions()> add_run_flags(CLI::App& app, const std::vector<std::string>& after_separator);
/// A subcommand that `tandem-torch` implements: this registers its name and help, and the
/// returned command replaces this process with the helper.
Command add_helper_command(CLI::App& app, const std::string& name, const std::string& description);
Command add_env_command(CLI::App& app);
/// `tandem checkpoint info | consolidate` (a tandem-torch subcommand).
Command add_checkpoint_command(CLI::App& app);
/// `tandem bench` (argv: the whole command line, recorded in results.json) and `tandem report`.
Command add_bench_command(CLI::App& app, int argc, char** argv);
Command add_report_command(CLI::App& app);
/// `tandem doctor LOGDIR`: the flight records' analysis of a failed job.
Command add_doctor_command(CLI::App& app);
/// `tandem plan`: every configuration's predicted memory and step time (src/plan/).
Command add_plan_command(CLI::App& app);

/// Parses argv and runs the chosen subcommand; the exit code of `tandem` and `tandem-torch`
/// (0 success, 1 a worker or the job failed, 2 bad input, 128+N stopped by signal N).
int run_cli(CLI::App& app, int argc, char** argv,
            const std::function<std::vector<Command>(CLI::App&, const std::vector<std::string>&)>& add_commands);

}  // namespace tandem::cli
