#include "common/durable_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tandem/error.h"

namespace tandem::detail {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

void UniqueFd::close_checked(const std::string& context) {
  int fd = fd_;
  fd_ = -1;
  // close(2) must not be retried on EINTR on Linux: the descriptor is released either way.
  if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) {
    throw Error(message(context, ": ", errno_text(errno)));
  }
}

std::string errno_text(int err) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly a static string, not `buffer`).
  return ::strerror_r(err, buffer, sizeof buffer);
}

std::string parent_directory(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_all(int fd, const void* data, size_t size, const std::string& context) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    // Linux writes at most 0x7ffff000 bytes per call; ask for no more than 1 GiB at a time.
    ssize_t n = ::write(fd, bytes, size < (size_t{1} << 30) ? size : (size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(message(context, ": ", errno_text(errno)));
    }
    if (n == 0) throw Error(message(context, ": the write made no progress"));
    bytes += n;
    size -= static_cast<size_t>(n);
  }
}

bool pread_all(int fd, void* data, size_t size, uint64_t offset, const std::string& context) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd, bytes, size < (size_t{1} << 30) ? size : (size_t{1} << 30),
                        static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(message(context, ": ", errno_text(errno)));
    }
    if (n == 0) return false;
    bytes += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

void fsync_fd(int fd, const std::string& context, const std::string& what) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    throw Error(message(context, ": cannot flush ", what, ": ", errno_text(errno)));
  }
}

void fsync_directory(const std::string& dir, const std::string& context) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(message(context, ": cannot open the folder ", dir, ": ", errno_text(errno)));
  fsync_fd(fd.get(), context, "the folder " + dir);
}

void write_file_durably(const std::string& path, const std::function<void(int fd)>& fill,
                        const std::string& context) {
  static std::atomic<uint64_t> counter{0};
  const std::string dir = parent_directory(path);
  const auto slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temporary;
  int raw = -1;
  for (;;) {
    temporary = message(dir, "/.", base, ".tmp-", ::getpid(), "-", counter++);
    raw = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (raw >= 0) break;
    if (errno != EEXIST) throw Error(message(context, ": cannot create ", temporary, ": ", errno_text(errno)));
  }
  UniqueFd fd(raw);
  try {
    fill(fd.get());
    fsync_fd(fd.get(), context, temporary);
    fd.close_checked(message(context, ": cannot close ", temporary));
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
      throw Error(message(context, ": cannot rename ", temporary, " to ", path, ": ", errno_text(errno)));
    }
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  fsync_directory(dir, context);
}

}  // namespace tandem::detail
