#pragma once
// One worker process of `tandem run`: started in its own process group so that a signal reaches
// everything it started, and tied to the launcher's life (PR_SET_PDEATHSIG) so that a launcher
// killed with SIGKILL leaves no orphan behind.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace tandem::launch {

struct WorkerSpec {
  int rank = 0;
  int local_rank = 0;
  std::string program_path;               // absolute or relative path, already checked
  std::vector<std::string> argv;          // argv[0] included
  std::vector<std::string> env;           // full environment, "KEY=VALUE"
};

class WorkerProcess {
 public:
  /// Forks and execs. Throws tandem::Error naming the program when exec fails.
  static WorkerProcess spawn(const WorkerSpec& spec);

  WorkerProcess(WorkerProcess&& other) noexcept;
  WorkerProcess& operator=(WorkerProcess&&) = delete;
  ~WorkerProcess();

  pid_t pid() const { return pid_; }
  int rank() const { return rank_; }
  int local_rank() const { return local_rank_; }
  int stdout_fd() const { return stdout_fd_; }   // read ends of the worker's output pipes
  int stderr_fd() const { return stderr_fd_; }

  /// Sends `signal` to the worker's whole process group (what it started may outlive it).
  void signal_group(int signal) const;
  /// Non-blocking reap; true once the worker has exited (then status() is set).
  bool poll_exit();
  bool running() const { return !status_.has_value(); }
  /// The raw wait status once exited.
  std::optional<int> status() const { return status_; }

  /// "exit code 3", "signal 9 (Killed)".
  static std::string describe_status(int status);

 private:
  WorkerProcess() = default;
  pid_t pid_ = -1;
  int rank_ = 0;
  int local_rank_ = 0;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::optional<int> status_;
};

}  // namespace tandem::launch
