#pragma once
// Private: POSIX file writes that survive a crash or a power loss (Note [Durable writes]).
//
// Note [Durable writes]
// A file is durable under its final name only when (1) its bytes were written to a temporary
// name in the same directory, (2) fsync'ed, (3) renamed over the final name (rename(2) is atomic:
// a reader sees the old file or the new one, never a mix), and (4) the directory was fsync'ed so
// that the rename itself survives a power loss. Skipping (2) lets ext4/xfs commit the rename
// before the data: a zero-length file under the final name after a crash.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tandem::detail {

/// An open file descriptor, closed on destruction (errors ignored there: use close_checked).
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  /// close(2), throwing tandem::Error "<context>: <strerror>" when it fails (NFS reports
  /// write errors there).
  void close_checked(const std::string& context);

 private:
  int fd_;
};

/// strerror(err), thread-safe.
std::string errno_text(int err);
/// The directory part of `path` ("." when it has none).
std::string parent_directory(const std::string& path);
/// Writes all `size` bytes (retrying short writes and EINTR); throws "<context>: <strerror>".
void write_all(int fd, const void* data, size_t size, const std::string& context);
/// Reads exactly `size` bytes at `offset`; returns false at a premature end of file; throws
/// "<context>: <strerror>" on an error.
bool pread_all(int fd, void* data, size_t size, uint64_t offset, const std::string& context);
/// fsync(2) of an open file; throws "<context>: cannot flush <what>: <strerror>".
void fsync_fd(int fd, const std::string& context, const std::string& what);
/// Opens `dir` and fsyncs it, so that the entries created or renamed in it are durable.
void fsync_directory(const std::string& dir, const std::string& context);
/// Writes `path` durably (Note [Durable writes]): `fill(fd)` writes the content into a temporary
/// file `.<name>.tmp-<pid>-<n>` beside it; on any failure the temporary file is removed and the
/// previous `path`, if any, is untouched. Errors are "<context>: cannot ...".
void write_file_durably(const std::string& path, const std::function<void(int fd)>& fill,
                        const std::string& context);

}  // namespace tandem::detail
