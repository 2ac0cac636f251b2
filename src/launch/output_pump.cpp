#include "launch/output_pump.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>

#include "tandem/error.h"

namespace tandem::launch {

void make_dirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && ::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        throw Error("cannot create log directory '" + partial + "': " + std::strerror(errno));
      }
    }
    if (i < path.size()) partial += path[i];
  }
}

OutputPump::OutputPump(std::string log_dir, int attempt)
    : dir_(std::move(log_dir) + "/attempt_" + std::to_string(attempt)) {
  make_dirs(dir_);
}

OutputPump::~OutputPump() {
  for (auto& s : streams_) finish(s);
}

std::string OutputPump::stdout_log(int rank) const { return dir_ + "/rank_" + std::to_string(rank) + ".stdout.log"; }
std::string OutputPump::stderr_log(int rank) const { return dir_ + "/rank_" + std::to_string(rank) + ".stderr.log"; }

std::string OutputPump::add(int rank, int stdout_fd, int stderr_fd) {
  for (bool err : {false, true}) {
    const std::string path = err ? stderr_log(rank) : stdout_log(rank);
    std::FILE* log = std::fopen(path.c_str(), "w");
    if (!log) throw Error("cannot write log file '" + path + "': " + std::strerror(errno));
    streams_.push_back(Stream{rank, err ? stderr_fd : stdout_fd, err, log, {}});
  }
  return stderr_log(rank);
}

void OutputPump::fill(std::vector<pollfd>& fds) const {
  for (const auto& s : streams_) {
    if (s.fd >= 0) fds.push_back(pollfd{s.fd, POLLIN, 0});
  }
}

bool OutputPump::on_ready(int fd) {
  for (auto& s : streams_) {
    if (s.fd == fd) {
      read_from(s);
      return true;
    }
  }
  return false;
}

void OutputPump::drain() {
  // The workers have exited; what is left is buffered output. A descendant that left the
  // worker's process group (setsid) could hold a pipe open forever: stop waiting after 2 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::vector<pollfd> fds;
    fill(fds);
    if (fds.empty()) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) break;
    for (const auto& p : fds) {
      if (p.revents) on_ready(p.fd);
    }
  }
  for (auto& s : streams_) finish(s);
}

void OutputPump::read_from(Stream& s) {
  char buffer[65536];
  ssize_t n;
  do {
    n = ::read(s.fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {  // EOF (or a broken pipe): the worker closed its end
    finish(s);
    return;
  }
  std::fwrite(buffer, 1, static_cast<size_t>(n), s.log);
  std::fflush(s.log);
  show(s, buffer, static_cast<size_t>(n));
}

void OutputPump::show(Stream& s, const char* data, size_t size) {
  s.partial.append(data, size);
  std::FILE* console = s.is_stderr ? stderr : stdout;
  size_t start = 0, newline;
  while ((newline = s.partial.find('\n', start)) != std::string::npos) {
    std::fprintf(console, "[rank%d]: %.*s\n", s.rank, static_cast<int>(newline - start),
                 s.partial.data() + start);
    start = newline + 1;
  }
  s.partial.erase(0, start);
  std::fflush(console);
}

void OutputPump::finish(Stream& s) {
  if (s.fd >= 0) {
    if (!s.partial.empty()) show(s, "\n", 1);
    s.fd = -1;  // the WorkerProcess owns and closes the descriptor
  }
  if (s.log) {
    std::fclose(s.log);
    s.log = nullptr;
  }
}

}  // namespace tandem::launch
