#pragma once
// OutputPump: copies each worker's stdout and stderr to its own log files, byte for byte, and to
// the launcher's stdout / stderr line by line with a "[rankN]: " prefix (torchrun's --tee style).
#include <poll.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tandem::launch {

/// mkdir -p; throws tandem::Error naming the folder it could not create.
void make_dirs(const std::string& path);

class OutputPump {
 public:
  /// Log files go to `log_dir/attempt_<attempt>/rank_<rank>.{stdout,stderr}.log`.
  OutputPump(std::string log_dir, int attempt);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  /// Starts following one worker's pipes. Returns the path of its stderr log.
  std::string add(int rank, int stdout_fd, int stderr_fd);

  /// Appends the pollfds to wait on; events for them go to on_ready().
  void fill(std::vector<pollfd>& fds) const;
  /// Reads what is ready on `fd`. Returns false if fd is not one of ours.
  bool on_ready(int fd);
  /// Reads what is left after all workers exited, until every pipe closes (2 s at most).
  void drain();

  std::string stdout_log(int rank) const;
  std::string stderr_log(int rank) const;
  const std::string& attempt_dir() const { return dir_; }

 private:
  struct Stream {
    int rank;
    int fd;
    bool is_stderr;
    std::FILE* log;
    std::string partial;  // bytes after the last newline, not yet shown
  };
  void read_from(Stream& s);
  void show(Stream& s, const char* data, size_t size);
  void finish(Stream& s);

  std::string dir_;
  std::vector<Stream> streams_;
};

}  // namespace tandem::launch
