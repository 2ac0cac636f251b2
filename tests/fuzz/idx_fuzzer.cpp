// libFuzzer harness for tandem::data::read_idx: the input is the file's bytes (gzip or plain IDX;
// zlib decides). A tandem::Error is the expected answer to a malformed file; any other exception,
// a sanitizer report or a tensor that disagrees with its header is a finding.
#include <cstdint>
#include <cstdlib>

#include <ATen/ATen.h>

#include "input_file.h"
#include "tandem/data/idx.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::InputFile file;
  const std::string& path = file.write(data, size);
  try {
    at::Tensor t = tandem::data::read_idx(path);
    // What read_idx promises of a file it accepts: 1 to 4 dimensions, none zero, contiguous CPU
    // data under 2 GiB.
    if (t.dim() < 1 || t.dim() > 4 || t.numel() == 0 || !t.is_contiguous() || !t.device().is_cpu() ||
        t.numel() * static_cast<int64_t>(t.element_size()) >= tandem::data::kMaxIdxDataBytes) {
      std::abort();
    }
  } catch (const tandem::Error&) {
  }
  return 0;
}
