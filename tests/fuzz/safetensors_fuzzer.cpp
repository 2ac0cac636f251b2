// libFuzzer harness for tandem::accelerate::load_safetensors: the input is the whole file (8-byte
// header length, JSON header, data). A tandem::Error is the expected answer to a malformed file;
// any other exception, a sanitizer report or a result that breaks the reader's promises is a
// finding.
#include <cstdint>
#include <cstdlib>
#include <set>

#include <ATen/ATen.h>

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
  } catch (const tandem::Error&) {
  }
  return 0;
}
