// `tandem run`: the torchrun counterpart. Flags keep torchrun's names (both --a-b and --a_b).
#include <cmath>
#include <thread>

#include "cli/commands.h"
#include "launch/gpu_count.h"
#include "tandem/error.h"
#include "launch/supervisor.h"

namespace tandem::cli {
namespace {

// A year: longer than any grace period means, and far inside what milliseconds in a long hold.
constexpr double kMaxGraceSeconds = 365.0 * 24 * 3600;

}  // namespace

std::function<launch::LaunchOptions()> add_run_flags(CLI::App& app, const std::vector<std::string>& after_separator) {
  auto* run = app.add_subcommand("run", "Start this node's workers with the torchrun environment");
  auto options = std::make_shared<launch::LaunchOptions>();
  auto grace_seconds = std::make_shared<double>(launch::kDefaultGracePeriod.count() / 1000.0);
  run->add_option("--nproc-per-node,--nproc_per_node", options->nproc_per_node,
                  "Workers on this node: a number, gpu, cpu or auto")->capture_default_str();
  run->add_option("--nnodes", options->nnodes_spec,
                  "Number of nodes, or MIN:MAX for an elastic job (nodes may leave and join; docs/cluster.md)")
      ->capture_default_str();
  run->add_option("--node-rank,--node_rank", options->node_rank, "This node's index, 0..nnodes-1")
      ->capture_default_str();
  run->add_option("--master-addr,--master_addr", options->master_addr,
                  "Host of node 0, which hosts the store (default 127.0.0.1 on one node)");
  run->add_option("--master-port,--master_port", options->master_port,
                  "Store port on node 0 (default: a free port, one node only)");
  run->add_option("--max-restarts,--max_restarts", options->max_restarts,
                  "Restart every worker up to N times after a failure")->capture_default_str();
  run->add_option("--rdzv-conf,--rdzv_conf", options->rdzv_conf,
                  "Elastic job: last_call_timeout=S (wait for more nodes once MIN are in, default 30), "
                  "join_timeout=S (for MIN nodes, default 600)");
  auto endpoint = std::make_shared<std::string>();
  run->add_option("--rdzv-endpoint,--rdzv_endpoint", *endpoint, "HOST:PORT: --master-addr and --master-port in one (torchrun's spelling)");
  run->add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", options->run_id,
                  "Job id; workers of another job are refused (default: random on one node)");
  run->add_option("--log-dir,--log_dir", options->log_dir,
                  "Folder for each rank's stdout and stderr (default: $TMPDIR/tandem-<run id>)");
  run->add_option("--backend", options->backend,
                  "auto or gloo: this launcher's own workers (gloo: TANDEM_CPU_BACKEND=gloo); mpi: start the "
                  "ranks through Open MPI's mpirun, which must be on PATH")->capture_default_str();
  run->add_option("--hosts", options->hosts,
                  "With --backend mpi: the nodes, h1,h2,... (--nproc-per-node ranks on each; this launcher "
                  "runs once, on h1, which hosts the store)");
  run->add_option("--grace-period", *grace_seconds,
                  "Seconds between SIGTERM and SIGKILL when stopping workers")->capture_default_str();
  // Everything from the program on belongs to the program: `tandem run [flags] [--] PROGRAM ARGS`.
  run->prefix_command();
  run->footer("Usage: tandem run [flags] -- PROGRAM [ARGS...]");

  return [options, grace_seconds, endpoint, run, after_separator]() {
    launch::LaunchOptions parsed = *options;
    if (!endpoint->empty()) {
      const size_t colon = endpoint->rfind(':');
      const std::string port = colon == std::string::npos ? "" : endpoint->substr(colon + 1);
      const bool digits = !port.empty() && port.size() < 6 && port.find_first_not_of("0123456789") == std::string::npos;
      if (colon == 0 || !digits) throw Error("--rdzv-endpoint '" + *endpoint + "' is not valid: expected HOST:PORT");
      if (!parsed.master_addr.empty() || parsed.master_port != 0) {
        throw Error("--rdzv-endpoint and --master-addr/--master-port say the same thing: give one of them");
      }
      parsed.master_addr = endpoint->substr(0, colon);
      parsed.master_port = std::atoi(port.c_str());
    }
    parsed.nnodes_given = run->get_option("--nnodes")->count() > 0;
    parsed.node_rank_given = run->get_option("--node-rank")->count() > 0;
    // `tandem run ./w a -- b`: the program came first, so that "--" is one of its arguments.
    parsed.command = run->remaining();
    if (!parsed.command.empty() && !after_separator.empty()) parsed.command.push_back("--");
    parsed.command.insert(parsed.command.end(), after_separator.begin(), after_separator.end());
    if (!parsed.command.empty() && parsed.command.front().rfind('-', 0) == 0 && parsed.command.front().size() > 1) {
      throw Error("unknown flag '" + parsed.command.front() + "' (see tandem run --help)");
    }
    // Casting a double outside long's range (1e300, inf, nan) to long is undefined behaviour:
    // refuse it first. A negative value within range is left to launch::resolve's message.
    if (!(std::fabs(*grace_seconds) <= kMaxGraceSeconds)) {
      throw Error(message("--grace-period ", *grace_seconds, " is not valid: expected seconds, 0 to ",
                          static_cast<long>(kMaxGraceSeconds), " (a year)"));
    }
    parsed.grace_period = std::chrono::milliseconds(static_cast<long>(*grace_seconds * 1000));
    return parsed;
  };
}

Command add_run_command(CLI::App& app, const std::vector<std::string>& after_separator) {
  auto parsed = add_run_flags(app, after_separator);
  return [parsed]() {
    launch::LaunchOptions options = parsed();
    const bool needs_gpu_count = options.nproc_per_node == "gpu" || options.nproc_per_node == "auto";
    launch::resolve(options, needs_gpu_count ? launch::visible_gpu_count() : 0,
                    static_cast<int>(std::thread::hardware_concurrency()));
    return launch::Supervisor(options).run();
  };
}

}  // namespace tandem::cli
