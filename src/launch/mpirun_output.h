#pragma once
// MpirunOutput: the output pump of `tandem run --backend mpi`. mpirun runs with --tag-output, so
// each piece of a rank's output arrives on mpirun's stdout or stderr behind a tag,
// "[1,N]<stdout>:", "[1,N]<stderr>:" or "[1,N]<stddiag>:" (a piece that ends without a newline
// runs straight into the next tag). This rewrites them as `tandem run` shows its own workers'
// output: "[rankN]: " line by line on the launcher's stdout or stderr (by the tag), and byte for
// byte into log_dir/attempt_<k>/rank_<N>.{stdout,stderr}.log. What mpirun says itself (no tag)
// passes through unprefixed and goes to attempt_<k>/mpirun.log too.
#include <poll.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace tandem::launch {

class MpirunOutput {
 public:
  /// Opens the log files of ranks 0..world-1 in `log_dir/attempt_<attempt>`. `console_out` and
  /// `console_err` are where the lines go (the launcher's stdout and stderr; tests pass files).
  MpirunOutput(std::string log_dir, int attempt, int world, std::FILE* console_out = stdout,
               std::FILE* console_err = stderr);
  ~MpirunOutput();
  MpirunOutput(const MpirunOutput&) = delete;
  MpirunOutput& operator=(const MpirunOutput&) = delete;

  /// Follows mpirun's pipes (read ends; the caller keeps owning them).
  void follow(int stdout_fd, int stderr_fd);
  void fill(std::vector<pollfd>& fds) const;
  bool on_ready(int fd);
  /// After mpirun exited: reads what is left (2 s at most), then flushes every partial line.
  void drain();

  /// Feeds bytes as if read from mpirun's stdout (`from_stderr` false) or stderr; for tests.
  void feed(bool from_stderr, const char* data, size_t size);
  /// Ends both streams: shows what is pending.
  void finish();

  /// The first rank mpirun named as failed ("process rank N", "Process name: [[J,1],N]"), or -1.
  int failed_rank() const { return failed_rank_; }
  /// mpirun's own lines that explain a failure ("... exited on signal 9 (Killed)."), joined by "; ".
  const std::string& mpirun_summary() const { return summary_; }
  std::string stderr_log(int rank) const;
  std::string mpirun_log() const { return dir_ + "/mpirun.log"; }

 private:
  struct Pipe {
    int fd = -1;
    bool is_stderr = false;
    std::string pending;   // bytes not yet parsed (a tag may be cut in two)
    int owner = -1;        // the rank whose piece is being read; -1: mpirun itself
    bool owner_stderr = false;
    std::string own_line;  // mpirun's own partial line
  };
  struct RankStream {
    std::FILE* log = nullptr;
    std::string partial;
  };
  void parse(Pipe& p, bool final);
  void append(Pipe& p, const char* data, size_t size);
  void own_line(Pipe& p, const std::string& line);
  RankStream& stream(int rank, bool is_stderr);
  void read_from(Pipe& p);

  std::string dir_;
  int world_;
  std::FILE* out_;
  std::FILE* err_;
  std::FILE* mpirun_log_ = nullptr;
  Pipe pipes_[2];
  std::map<std::pair<int, bool>, RankStream> ranks_;
  int failed_rank_ = -1;
  std::string summary_;
};

}  // namespace tandem::launch
