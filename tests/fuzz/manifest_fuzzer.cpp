// libFuzzer harness for tandem::accelerate::CheckpointReader: the input is manifest.json. It sits
// in a checkpoint folder this process creates once under $TMPDIR or /dev/shm (removed at exit) beside three
// fixed files, so that a manifest naming them with the right sizes and CRC-32s (the seeds do)
// reaches the verification and read() paths. Only manifest.json is rewritten per input.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/error.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::perror(what.c_str());
  std::abort();
}

void write_file(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()) || ::close(fd) != 0) {
    die(path);
  }
}

// The checkpoint folder: model.safetensors (8 bytes; the seeds list its size and CRC-32),
// state.json (empty), rank_1/rng.bin, and an empty folder `empty_dir` for names that are folders.
struct Checkpoint {
  std::string dir;
  std::string manifest;
  Checkpoint() {
    // /dev/shm (tmpfs) unless TMPDIR says otherwise: ext4 flushes a file truncated and rewritten
    // on every close, which made each input cost a disk write (400 inputs/s instead of 10,000).
    const char* tmp = std::getenv("TMPDIR");
    struct stat st {};
    const std::string base = tmp && *tmp ? tmp : ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    std::string templ = base + "/tandem-fuzz-manifest-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) die("mkdtemp " + templ);
    dir = templ;
    manifest = dir + "/manifest.json";
    write_file(dir + "/model.safetensors", "tandem!\n");
    write_file(dir + "/state.json", "");
    if (::mkdir((dir + "/rank_1").c_str(), 0755) != 0 || ::mkdir((dir + "/empty_dir").c_str(), 0755) != 0) die("mkdir");
    write_file(dir + "/rank_1/rng.bin", std::string("\x00\x01\x02\x03", 4));
  }
  ~Checkpoint() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Checkpoint checkpoint;
  write_file(checkpoint.manifest, std::string(reinterpret_cast<const char*>(data), size));
  try {
    tandem::accelerate::CheckpointReader reader(checkpoint.dir);
    for (const auto& file : reader.files()) {
      // Verified once by the constructor, so reading must succeed and give the listed size.
      if (!reader.contains(file.name) || reader.read(file.name).size() != file.size) std::abort();
      reader.path(file.name);
    }
    if (reader.contains("manifest.json")) std::abort();
  } catch (const tandem::Error&) {
  }
  return 0;
}
