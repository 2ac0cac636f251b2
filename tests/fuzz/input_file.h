#pragma once
// The fuzzer's input as a file, for readers that take a path (read_idx, load_safetensors): an
// anonymous in-memory file (memfd_create) opened as /proc/self/fd/N and rewritten for every
// input. Nothing is written to any disk, and nothing is left behind if the process dies.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

class InputFile {
 public:
  InputFile() : fd_(::memfd_create("tandem-fuzz-input", MFD_CLOEXEC)) {
    if (fd_ < 0) die("memfd_create");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Makes the file hold exactly `data` and returns its path.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) die("ftruncate");
    if (size > 0 && ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) die("pwrite");
    return path_;
  }

 private:
  // A harness that cannot set up its input is broken, not the code under test: stop loudly.
  [[noreturn]] static void die(const char* what) {
    std::perror(what);
    std::abort();
  }

  int fd_;
  std::string path_;
};

}  // namespace tandem::fuzz
