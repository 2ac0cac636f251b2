#include "bench/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "tandem/error.h"

extern char** environ;

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log_path,
                   const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& kv : extra_env) {
    const auto key = kv.substr(0, kv.find('=') + 1);
    env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(key, 0) == 0; }),
              env.end());
    env.push_back(kv);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int out = ::open(log_path.empty() ? "/dev/null" : log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(out >= 0, "cannot create ", log_path, ": ", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    throw Error(message("cannot start ", argv[0], ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // dup2 clears CLOEXEC on stdin
    if (null_in >= 0) ::dup2(null_in, STDIN_FILENO);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out);
  return pid;
}

Finished wait_bounded(pid_t pid, double timeout_s, const std::function<bool()>& stop_requested) {
  Finished finished;
  const auto start = Clock::now();
  std::optional<Clock::time_point> terminated_at;
  while (true) {
    const pid_t r = ::waitpid(pid, &finished.status, WNOHANG);
    if (r == pid) return finished;
    if (r < 0 && errno != EINTR) throw Error(message("waitpid: ", std::strerror(errno)));
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const bool stop = stop_requested && stop_requested();
    if (!terminated_at && (elapsed > timeout_s || stop)) {
      (stop ? finished.stopped : finished.timed_out) = true;
      ::kill(pid, SIGTERM);
      terminated_at = Clock::now();
    }
    if (terminated_at && Clock::now() - *terminated_at > std::chrono::seconds(10)) ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string output_of(const std::vector<std::string>& argv, double timeout_s, Finished& finished,
                      const std::function<bool()>& stop_requested) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string name = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/tandem-bench-output-XXXXXX";
  const int fd = ::mkstemp(name.data());
  TANDEM_CHECK(fd >= 0, "cannot create a temporary file: ", std::strerror(errno));
  ::close(fd);
  struct Unlink {
    const std::string& path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_later{name};
  finished = wait_bounded(spawn_logged(argv, name), timeout_s, stop_requested);
  std::ifstream in(name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string last_nonempty_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace tandem::bench
