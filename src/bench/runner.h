#pragma once
// Running one measurement: `tandem run` starts the worker (ours or the PyTorch peer) as a process
// group of `world` ranks, the worker appends its record, and the runner reads it back. Output
// goes to a log file per measurement, so the terminal shows only the bench's progress.
#include <optional>
#include <string>

#include "bench/plan.h"
#include "bench/results.h"

namespace tandem::bench {

/// The programs a bench run needs.
struct Tools {
  std::string tandem;  // this binary, for `tandem run`
  std::string worker;  // libexec/tandem/tandem-bench-worker
  std::string peer;    // share/tandem/bench/peer.py
  std::string python;  // the interpreter for the peer
};

/// Finds the installed parts beside this binary; `python` is the --python flag (may be empty:
/// then $TANDEM_PYTHON, the virtual environment Tandem was configured with, or python3).
/// Throws tandem::Error naming a missing worker.
Tools find_tools(const std::string& python);

/// Throws tandem::Error when `path`, the program `what` names ("the benchmark worker"), is not
/// executable, saying how to build it: scripts/demo builds only the CLI and its example.
void require_worker(const std::string& what, const std::string& path);

/// What the Python can run: "" when it imports torch and `modules` (the strategies' peer_modules,
/// e.g. accelerate), else the one-line reason. `versions` receives their versions.
std::string probe_peers(const Tools& tools, const std::vector<std::string>& modules, std::string& versions);

struct Outcome {
  std::optional<Run> run;
  std::string failure;       // set when no record came back
  bool interrupted = false;  // the bench was stopped (SIGINT/SIGTERM): stop planning
  double wall_s = 0;
};

/// Runs one measurement; its output goes to `log_path`, its record to `record_path`.
/// `timeout_s` bounds it: a hung measurement is stopped and reported, never waited for forever.
Outcome run_measurement(const Tools& tools, const BenchConfig& config, const Planned& planned,
                        const std::string& log_path, const std::string& record_path, double timeout_s);

/// Whether SIGINT or SIGTERM asked the bench to stop (find_tools installs the handlers): the
/// running measurement is stopped, what was measured is kept.
bool stop_requested();

/// Whether this build has the MPI backend (TANDEM_BUILT_WITH_MPI, from the configure step: the
/// bench links no LibTorch, so it cannot ask libtandem).
bool mpi_backend_built();

/// The worker's flags for one measurement (both workers take the same ones).
std::vector<std::string> worker_arguments(const BenchConfig& config, const Measurement& m,
                                          const std::string& record_path);

}  // namespace tandem::bench
