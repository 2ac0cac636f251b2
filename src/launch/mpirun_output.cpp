#include "launch/mpirun_output.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "launch/output_pump.h"
#include "tandem/error.h"

namespace tandem::launch {
namespace {

enum class Tag { Match, NoMatch, Incomplete };

struct TagMatch {
  Tag state = Tag::NoMatch;
  long rank = -1;
  bool is_stderr = false;
  size_t end = 0;  // just past the ':'
};

// Reads "[J,N]<stdout>:" / "<stderr>:" / "<stddiag>:" at b[i] (b[i] == '['). Incomplete: the
// buffer ends before the tag could be told apart from text.
class TagReader {
 public:
  TagReader(const std::string& b, size_t i) : b_(b), k_(i + 1) {}

  TagMatch read() {
    TagMatch m;
    long job = 0;
    Tag t = number(job);
    if (t == Tag::Match) t = literal(",");
    if (t == Tag::Match) t = number(m.rank);
    if (t == Tag::Match) t = literal("]<std");
    if (t == Tag::Match) {
      if (k_ + 3 > b_.size()) {
        t = Tag::Incomplete;
      } else if (b_.compare(k_, 3, "out") == 0) {
        k_ += 3;
        t = literal(">:");
      } else if (b_.compare(k_, 3, "err") == 0) {
        k_ += 3;
        m.is_stderr = true;
        t = literal(">:");
      } else {
        t = literal("diag>:");
        m.is_stderr = true;
      }
    }
    m.state = t;
    m.end = k_;
    return m;
  }

 private:
  Tag number(long& value) {
    size_t digits = 0;
    value = 0;
    while (k_ < b_.size() && b_[k_] >= '0' && b_[k_] <= '9') {
      if (++digits > 9) return Tag::NoMatch;
      value = value * 10 + (b_[k_] - '0');
      ++k_;
    }
    if (k_ == b_.size()) return Tag::Incomplete;
    return digits ? Tag::Match : Tag::NoMatch;
  }
  Tag literal(const char* text) {
    for (const char* c = text; *c; ++c, ++k_) {
      if (k_ == b_.size()) return Tag::Incomplete;
      if (b_[k_] != *c) return Tag::NoMatch;
    }
    return Tag::Match;
  }
  const std::string& b_;
  size_t k_;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// The rank in "... process rank 3 with PID ..." or "Process name: [[30548,1],3]", else -1.
int rank_in(const std::string& line) {
  size_t at = line.find("process rank ");
  if (at != std::string::npos) return std::atoi(line.c_str() + at + 13);
  at = line.find("Process name: [[");
  if (at != std::string::npos) {
    const size_t close = line.find("],", at);
    if (close != std::string::npos) return std::atoi(line.c_str() + close + 2);
  }
  return -1;
}

}  // namespace

MpirunOutput::MpirunOutput(std::string log_dir, int attempt, int world, std::FILE* console_out,
                           std::FILE* console_err)
    : dir_(std::move(log_dir) + "/attempt_" + std::to_string(attempt)), world_(world), out_(console_out),
      err_(console_err) {
  make_dirs(dir_);
  auto open = [](const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error("cannot write log file '" + path + "': " + std::strerror(errno));
    return f;
  };
  mpirun_log_ = open(mpirun_log());
  for (int r = 0; r < world_; ++r) {
    for (bool err : {false, true}) {
      ranks_[{r, err}].log = open(dir_ + "/rank_" + std::to_string(r) + (err ? ".stderr.log" : ".stdout.log"));
    }
  }
  pipes_[1].is_stderr = true;
}

MpirunOutput::~MpirunOutput() {
  finish();
  for (auto& [key, s] : ranks_) {
    if (s.log) std::fclose(s.log);
  }
  if (mpirun_log_) std::fclose(mpirun_log_);
}

std::string MpirunOutput::stderr_log(int rank) const { return dir_ + "/rank_" + std::to_string(rank) + ".stderr.log"; }

void MpirunOutput::follow(int stdout_fd, int stderr_fd) {
  pipes_[0].fd = stdout_fd;
  pipes_[1].fd = stderr_fd;
}

void MpirunOutput::fill(std::vector<pollfd>& fds) const {
  for (const auto& p : pipes_) {
    if (p.fd >= 0) fds.push_back(pollfd{p.fd, POLLIN, 0});
  }
}

bool MpirunOutput::on_ready(int fd) {
  for (auto& p : pipes_) {
    if (p.fd >= 0 && p.fd == fd) {
      read_from(p);
      return true;
    }
  }
  return false;
}

void MpirunOutput::read_from(Pipe& p) {
  char buffer[65536];
  ssize_t n;
  do {
    n = ::read(p.fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {  // EOF: mpirun (and every rank it started here) closed its end
    p.fd = -1;   // the WorkerProcess owns and closes the descriptor
    parse(p, true);
    return;
  }
  p.pending.append(buffer, static_cast<size_t>(n));
  parse(p, false);
}

void MpirunOutput::drain() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::vector<pollfd> fds;
    fill(fds);
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) break;
    for (const auto& p : fds) {
      if (p.revents) on_ready(p.fd);
    }
  }
  for (auto& p : pipes_) p.fd = -1;
  finish();
}

void MpirunOutput::feed(bool from_stderr, const char* data, size_t size) {
  Pipe& p = pipes_[from_stderr ? 1 : 0];
  p.pending.append(data, size);
  parse(p, false);
}

void MpirunOutput::finish() {
  for (auto& p : pipes_) {
    parse(p, true);
    if (!p.own_line.empty()) own_line(p, p.own_line);
    p.own_line.clear();
  }
  for (auto& [key, s] : ranks_) {
    if (!s.partial.empty()) {
      std::fprintf(key.second ? err_ : out_, "[rank%d]: %.*s\n", key.first, static_cast<int>(s.partial.size()),
                   s.partial.data());
      s.partial.clear();
    }
    if (s.log) std::fflush(s.log);
  }
  std::fflush(out_);
  std::fflush(err_);
}

MpirunOutput::RankStream& MpirunOutput::stream(int rank, bool is_stderr) { return ranks_[{rank, is_stderr}]; }

void MpirunOutput::parse(Pipe& p, bool final) {
  std::string& b = p.pending;
  size_t i = 0;
  while (i < b.size()) {
    if (b[i] == '[') {
      const TagMatch m = TagReader(b, i).read();
      if (m.state == Tag::Incomplete && !final) break;  // wait for the rest of the tag
      if (m.state == Tag::Match && m.rank >= 0 && m.rank < world_) {
        p.owner = static_cast<int>(m.rank);
        p.owner_stderr = m.is_stderr;
        i = m.end;
        continue;
      }
    }
    // Up to the end of the line, or the next '[' (a tag may start there).
    const size_t newline = b.find('\n', i);
    size_t end = std::min(newline == std::string::npos ? b.size() : newline + 1, b.find('[', i + 1));
    append(p, b.data() + i, end - i);
    i = end;
  }
  b.erase(0, i);
}

void MpirunOutput::append(Pipe& p, const char* data, size_t size) {
  const bool line_ends = size > 0 && data[size - 1] == '\n';
  if (p.owner < 0) {
    p.own_line.append(data, line_ends ? size - 1 : size);
    if (line_ends) {
      own_line(p, p.own_line);
      p.own_line.clear();
    }
    return;
  }
  RankStream& s = stream(p.owner, p.owner_stderr);
  if (s.log) {
    std::fwrite(data, 1, size, s.log);
    std::fflush(s.log);
  }
  s.partial.append(data, line_ends ? size - 1 : size);
  if (line_ends) {
    std::FILE* console = p.owner_stderr ? err_ : out_;
    std::fprintf(console, "[rank%d]: %.*s\n", p.owner, static_cast<int>(s.partial.size()), s.partial.data());
    std::fflush(console);
    s.partial.clear();
    p.owner = -1;  // the next line carries its own tag, or is mpirun's
  }
}

void MpirunOutput::own_line(Pipe& p, const std::string& line) {
  std::FILE* console = p.is_stderr ? err_ : out_;
  std::fprintf(console, "%s\n", line.c_str());
  std::fflush(console);
  if (mpirun_log_) {
    std::fprintf(mpirun_log_, "%s\n", line.c_str());
    std::fflush(mpirun_log_);
  }
  const int rank = rank_in(line);
  if (rank >= 0 && failed_rank_ < 0) failed_rank_ = rank;
  const std::string t = trim(line);
  if (rank >= 0 || t.rfind("Exit code:", 0) == 0) {
    std::string compact;
    for (char c : t) {
      if (!(c == ' ' && !compact.empty() && compact.back() == ' ')) compact += c;
    }
    summary_ += (summary_.empty() ? "" : "; ") + compact;
  }
}

}  // namespace tandem::launch
