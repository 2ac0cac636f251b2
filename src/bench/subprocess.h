#pragma once
// Running a child program for the bench: its output to a file, stdin from /dev/null, a bounded
// wait. The runner starts `tandem run` with it and the plots start gnuplot with it.
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace tandem::bench {

/// Starts argv (argv[0] a path) with stdout and stderr to `log_path` (created or truncated;
/// empty: discarded) and this environment plus `extra_env` ("KEY=VALUE", replacing KEY).
/// Throws tandem::Error when the log cannot be created or the process cannot be forked.
pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log_path,
                   const std::vector<std::string>& extra_env = {});

struct Finished {
  int status = 0;          // the wait status
  bool timed_out = false;  // stopped at the deadline
  bool stopped = false;    // stopped because `stop_requested` said so
};

/// Waits for `pid`. At the deadline, or once `stop_requested()` is true, it gets SIGTERM, and
/// SIGKILL 10 s later: a child is always reaped, never waited for forever.
Finished wait_bounded(pid_t pid, double timeout_s, const std::function<bool()>& stop_requested = {});

/// Runs a short command to its end (bounded as above) and returns its output, stdout and
/// stderr together.
std::string output_of(const std::vector<std::string>& argv, double timeout_s, Finished& finished,
                      const std::function<bool()>& stop_requested = {});

/// The last line of `text` that is not blank ("" when there is none).
std::string last_nonempty_line(const std::string& text);

}  // namespace tandem::bench
