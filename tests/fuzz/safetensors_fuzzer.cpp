// libFuzzer harness for tandem::accelerate::load_safetensors and, on what it accepts, for the
// sharded-files index (Note [Sharded files]: its tandem_chunks / tandem_rows metadata and the
// tiling check) over that one file: the input is the whole file (8-byte header length, JSON
// header, data). A tandem::Error is the expected answer to a malformed file; any other exception,
// a sanitizer report or a result that breaks the readers' promises is a finding.
#include <cstdint>
#include <cstdlib>
#include <set>

#include <ATen/ATen.h>

#include "accelerate/sharded_tensors.h"
#include "input_file.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::InputFile file;
  const std::string& path = file.write(data, size);
  try {
    auto loaded = tandem::accelerate::load_safetensors(path);
    // An accepted file's tensors tile its data exactly, with unique names, each contiguous on the
    // CPU, and every BOOL element is 0 or 1.
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
    uint64_t bytes = 0;
    std::set<std::string> names;
    for (const auto& [name, t] : loaded.tensors) {
      if (!names.insert(name).second || !t.is_contiguous() || !t.device().is_cpu()) std::abort();
      bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
      if (t.scalar_type() == at::kBool && t.numel() > 0 && t.view(at::kByte).max().item<uint8_t>() > 1) std::abort();
    }
    if (8 + header + bytes != size) std::abort();
    // One file accepted as a sharded set holds each tensor whole (as one piece that covers it):
    // read back, each is the file's tensor in its whole shape, byte for byte (NaNs included).
    try {
      const tandem::accelerate::ShardedTensors set({path}, "fuzz");
      for (const auto& [name, t] : loaded.tensors) {
        const at::Tensor whole = set.whole(name);
        if (whole.sizes() != c10::IntArrayRef(set.shape(name)) || whole.scalar_type() != t.scalar_type() ||
            whole.numel() != t.numel() ||
            !at::equal(whole.reshape(-1).view(at::kByte), t.contiguous().reshape(-1).view(at::kByte))) {
          std::abort();
        }
      }
      if (set.names().size() != loaded.tensors.size()) std::abort();
    } catch (const tandem::Error&) {
    }
  } catch (const tandem::Error&) {
  }
  return 0;
}
