// `tandem run`: the torchrun counterpart. Flags keep torchrun's names (both --a-b and --a_b).
#include <thread>

#include "cli/commands.h"
#include "launch/gpu_count.h"
#include "tandem/error.h"
#include "launch/supervisor.h"

namespace tandem::cli {

Command add_run_command(CLI::App& app, const std::vector<std::string>& after_separator) {
  auto* run = app.add_subcommand("run", "Start this node's workers with the torchrun environment");
  auto options = std::make_shared<launch::LaunchOptions>();
  auto grace_seconds = std::make_shared<double>(launch::kDefaultGracePeriod.count() / 1000.0);
  run->add_option("--nproc-per-node,--nproc_per_node", options->nproc_per_node,
                  "Workers on this node: a number, gpu, cpu or auto")->capture_default_str();
  run->add_option("--nnodes", options->nnodes, "Number of nodes")->capture_default_str();
  run->add_option("--node-rank,--node_rank", options->node_rank, "This node's index, 0..nnodes-1")
      ->capture_default_str();
  run->add_option("--master-addr,--master_addr", options->master_addr,
                  "Host of node 0, which hosts the store (default 127.0.0.1 on one node)");
  run->add_option("--master-port,--master_port", options->master_port,
                  "Store port on node 0 (default: a free port, one node only)");
  run->add_option("--max-restarts,--max_restarts", options->max_restarts,
                  "Restart every worker up to N times after a failure")->capture_default_str();
  run->add_option("--run-id,--run_id", options->run_id,
                  "Job id; workers of another job are refused (default: random on one node)");
  run->add_option("--log-dir,--log_dir", options->log_dir,
                  "Folder for each rank's stdout and stderr (default: $TMPDIR/tandem-<run id>)");
  run->add_option("--grace-period", *grace_seconds,
                  "Seconds between SIGTERM and SIGKILL when stopping workers")->capture_default_str();
  // Everything from the program on belongs to the program: `tandem run [flags] [--] PROGRAM ARGS`.
  run->prefix_command();
  run->footer("Usage: tandem run [flags] -- PROGRAM [ARGS...]");

  return [options, grace_seconds, run, after_separator]() {
    // `tandem run ./w a -- b`: the program came first, so that "--" is one of its arguments.
    options->command = run->remaining();
    if (!options->command.empty() && !after_separator.empty()) options->command.push_back("--");
    options->command.insert(options->command.end(), after_separator.begin(), after_separator.end());
    if (!options->command.empty() && options->command.front().rfind('-', 0) == 0 &&
        options->command.front().size() > 1) {
      throw Error("unknown flag '" + options->command.front() + "' (see tandem run --help)");
    }
    options->grace_period = std::chrono::milliseconds(static_cast<long>(*grace_seconds * 1000));
    const bool needs_gpu_count = options->nproc_per_node == "gpu" || options->nproc_per_node == "auto";
    launch::resolve(*options, needs_gpu_count ? launch::visible_gpu_count() : 0,
                    static_cast<int>(std::thread::hardware_concurrency()));
    return launch::Supervisor(*options).run();
  };
}

}  // namespace tandem::cli
