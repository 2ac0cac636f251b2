#include "launch/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/error.h"

namespace tandem::launch {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

WorkerProcess WorkerProcess::spawn(const WorkerSpec& spec) {
  int out[2], err[2], exec_error[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(exec_error, O_CLOEXEC) != 0) {
    throw Error(std::string("cannot create pipes for a worker: ") + std::strerror(errno));
  }
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to execve.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::execve(spec.program_path.c_str(), argv.data(), envp.data());
    int code = errno;
    (void)!::write(exec_error[1], &code, sizeof(code));
    ::_exit(127);
  }
  // Parent. setpgid here too, so the group exists before we might signal it.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_error[1]);
  int code = 0;
  ssize_t n;
  do {
    n = ::read(exec_error[0], &code, sizeof(code));
  } while (n < 0 && errno == EINTR);
  ::close(exec_error[0]);

  WorkerProcess w;
  w.pid_ = pid;
  w.rank_ = spec.rank;
  w.local_rank_ = spec.local_rank;
  w.stdout_fd_ = out[0];
  w.stderr_fd_ = err[0];
  if (n == static_cast<ssize_t>(sizeof(code))) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    w.status_ = status;
    throw Error("cannot start worker '" + spec.program_path + "': " + std::strerror(code));
  }
  return w;
}

WorkerProcess::WorkerProcess(WorkerProcess&& o) noexcept
    : pid_(o.pid_), rank_(o.rank_), local_rank_(o.local_rank_), stdout_fd_(o.stdout_fd_),
      stderr_fd_(o.stderr_fd_), status_(o.status_) {
  o.pid_ = -1;
  o.stdout_fd_ = o.stderr_fd_ = -1;
}

WorkerProcess::~WorkerProcess() {
  // Never leave a worker behind: a WorkerProcess that dies unreaped kills and reaps its group.
  if (pid_ > 0 && running()) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
}

void WorkerProcess::signal_group(int signal) const {
  if (pid_ > 0) ::kill(-pid_, signal);
}

bool WorkerProcess::poll_exit() {
  if (!running()) return true;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    status_ = status;
    return true;
  }
  return false;
}

std::string WorkerProcess::describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "status " + std::to_string(status);
}

}  // namespace tandem::launch
