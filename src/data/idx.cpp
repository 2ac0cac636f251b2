#include "tandem/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem::data {
namespace {

// The first read's buffer; it doubles from there up to the size the header promises.
constexpr int64_t kFirstReadBytes = int64_t{1} << 20;

struct ElementType {
  uint8_t code;
  at::ScalarType dtype;
  int64_t size;
};

constexpr ElementType kElementTypes[] = {
    {0x08, at::kByte, 1}, {0x09, at::kChar, 1},  {0x0B, at::kShort, 2},
    {0x0C, at::kInt, 4},  {0x0D, at::kFloat, 4}, {0x0E, at::kDouble, 8},
};

std::string hex_byte(uint8_t b) {
  const char* digits = "0123456789abcdef";
  return {digits[b >> 4], digits[b & 0xF]};
}

// A gzip or plain file read through zlib (gzread passes a non-gzip file through unchanged).
// Every failure is a tandem::Error naming the file; the handle is closed on every path.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    // stat first: a directory would open and then fail to read, and a FIFO would block in open().
    struct stat info {};
    TANDEM_CHECK(::stat(path.c_str(), &info) == 0, "IDX file ", path, ": cannot open it (", std::strerror(errno), ")");
    TANDEM_CHECK(S_ISREG(info.st_mode), "IDX file ", path, ": not a regular file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rbe");  // e: O_CLOEXEC
    TANDEM_CHECK(file_ != nullptr, "IDX file ", path, ": cannot open it (",
                 errno != 0 ? std::strerror(errno) : "out of memory", ")");
    gzbuffer(file_, 1 << 17);
  }
  ~GzFile() { gzclose_r(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  /// Reads up to `n` bytes into `out`: fewer only where the data ends. Throws on corrupt gzip.
  int64_t read(void* out, int64_t n) {
    int64_t got = 0;
    while (got < n) {
      auto chunk = static_cast<unsigned>(std::min<int64_t>(n - got, int64_t{1} << 30));
      int r = gzread(file_, static_cast<char*>(out) + got, chunk);
      check_stream(r < 0);
      if (r == 0) break;
      got += r;
    }
    return got;
  }

 private:
  // zlib reports a truncated gzip stream ("unexpected end of file") as a short read with the error
  // recorded, and corrupt data as -1: both end up here.
  void check_stream(bool failed) {
    int code = Z_OK;
    const char* text = gzerror(file_, &code);
    if (!failed && code == Z_OK) return;
    std::string reason = text != nullptr ? text : "unknown error";
    // zlib prefixes its messages with the path it was given.
    std::string prefix = path_ + ": ";
    if (reason.compare(0, prefix.size(), prefix) == 0) reason.erase(0, prefix.size());
    if (code == Z_ERRNO) reason = std::strerror(errno);
    throw Error(message("IDX file ", path_, ": corrupt gzip data (zlib: ", reason, ")"));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text;
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? " x " : "") + std::to_string(dims[i]);
  return text;
}

// IDX stores elements big-endian; convert them in place to the host's order.
void to_host_order(uint8_t* data, int64_t count, int64_t size) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (size == 1) return;
  for (int64_t i = 0; i < count; ++i) std::reverse(data + i * size, data + (i + 1) * size);
#else
  (void)data, (void)count, (void)size;
#endif
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  GzFile file(path);
  const std::string where = "IDX file " + path + ": ";

  uint8_t magic[4] = {0, 0, 0, 0};
  int64_t got = file.read(magic, 4);
  TANDEM_CHECK(got == 4, where, "not an IDX file (it holds ", got,
               " bytes; an IDX file starts with a 4-byte magic: 00 00, a type code, the number of dimensions)");
  TANDEM_CHECK(magic[0] == 0 && magic[1] == 0, where, "not an IDX file (it starts with ", hex_byte(magic[0]), " ",
               hex_byte(magic[1]), " ", hex_byte(magic[2]), " ", hex_byte(magic[3]),
               "; an IDX file starts with 00 00, a type code, the number of dimensions)");
  const ElementType* type = nullptr;
  for (const auto& candidate : kElementTypes) {
    if (candidate.code == magic[2]) type = &candidate;
  }
  TANDEM_CHECK(type != nullptr, where, "unsupported element type 0x", hex_byte(magic[2]),
               " (expected 0x08 uint8, 0x09 int8, 0x0b int16, 0x0c int32, 0x0d float32 or 0x0e float64)");
  const int rank = magic[3];
  TANDEM_CHECK(rank >= 1 && rank <= 4, where, "the header says ", rank, " dimensions (expected 1 to 4)");

  uint8_t header[16];
  got = file.read(header, 4 * rank);
  TANDEM_CHECK(got == 4 * rank, where, "truncated header (", rank, " dimensions need ", 4 * rank,
               " bytes after the magic, the file has ", got, ")");
  std::vector<int64_t> dims(rank);
  for (int i = 0; i < rank; ++i) {
    const uint8_t* d = header + 4 * i;
    dims[i] = (int64_t{d[0]} << 24) | (int64_t{d[1]} << 16) | (int64_t{d[2]} << 8) | int64_t{d[3]};
  }
  TANDEM_CHECK(std::find(dims.begin(), dims.end(), 0) == dims.end(), where, "dimensions ", dims_text(dims),
               " (expected every dimension to be at least 1)");
  // bytes * d < 2 GiB, checked before multiplying: `bytes` never overflows.
  int64_t bytes = type->size;
  for (int64_t d : dims) {
    TANDEM_CHECK(bytes <= (kMaxIdxDataBytes - 1) / d, where, "dimensions ", dims_text(dims), " of ", type->size,
                 "-byte elements make 2 GiB of data or more (expected less than 2 GiB)");
    bytes *= d;
  }

  // Grow the buffer as data arrives rather than trusting the header with one big allocation: a
  // short file costs what it holds, not what it claims. The last step grows it to exactly `bytes`.
  at::Tensor data = at::empty({std::min(bytes, kFirstReadBytes)}, at::kByte);
  int64_t filled = file.read(data.data_ptr(), data.numel());
  while (filled == data.numel() && filled < bytes) {
    at::Tensor larger = at::empty({std::min(bytes, 2 * filled)}, at::kByte);
    std::memcpy(larger.data_ptr(), data.data_ptr(), static_cast<size_t>(filled));
    data = larger;
    filled += file.read(data.data_ptr<uint8_t>() + filled, data.numel() - filled);
  }
  TANDEM_CHECK(filled == bytes, where, "truncated (dimensions ", dims_text(dims), " need ", bytes,
               " bytes of data, the file has ", filled, ")");
  int64_t trailing = 0;
  uint8_t scratch[1 << 14];
  for (int64_t n; (n = file.read(scratch, sizeof scratch)) > 0;) trailing += n;
  TANDEM_CHECK(trailing == 0, where, trailing, " bytes after the ", bytes, " bytes of data for dimensions ",
               dims_text(dims), " (expected the file to end there)");

  to_host_order(data.data_ptr<uint8_t>(), bytes / type->size, type->size);
  return data.view(type->dtype).view(dims);
}

}  // namespace tandem::data
