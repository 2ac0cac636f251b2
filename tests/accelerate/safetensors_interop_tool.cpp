// The C++ side of the safetensors interop test (safetensors_interop.py drives it):
//   write <dir>             writes <dir>/cpp.safetensors (the recipe, two metadata keys) and
//                           <dir>/cpp_one_key.safetensors (the recipe, one metadata key)
//   check <file>            loads a file Python wrote from the same recipe and compares it exactly
//   write-checkpoint <root> commits <root>/checkpoint_000042 with model.safetensors and state.json
// Exit status 0 when everything matched; every mismatch is printed on its own line.
#include <cstdio>
#include <map>
#include <string>

#include <ATen/ATen.h>

#include "accelerate/safetensors_recipe.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

namespace {

std::string bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
}

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

int check(const std::string& path) {
  auto file = tandem::accelerate::load_safetensors(path);
  std::map<std::string, at::Tensor> loaded(file.tensors.begin(), file.tensors.end());
  int mismatches = 0;
  auto fail = [&](const std::string& what) {
    std::printf("MISMATCH %s\n", what.c_str());
    ++mismatches;
  };
  const auto expected = tandem::test::recipe_tensors();
  if (loaded.size() != expected.size()) {
    fail("the file holds " + std::to_string(loaded.size()) + " tensors, the recipe " + std::to_string(expected.size()));
  }
  for (const auto& [name, want] : expected) {
    auto it = loaded.find(name);
    if (it == loaded.end()) {
      fail(name + ": missing");
      continue;
    }
    const at::Tensor& got = it->second;
    if (got.scalar_type() != want.scalar_type()) {
      fail(name + ": dtype " + c10::toString(got.scalar_type()) + ", expected " + c10::toString(want.scalar_type()));
    } else if (!got.sizes().equals(want.sizes())) {
      fail(name + ": shape " + shape_of(got) + ", expected " + shape_of(want));
    } else if (bytes_of(got) != bytes_of(want)) {
      fail(name + ": the bytes differ");
    }
  }
  if (file.metadata != tandem::test::recipe_metadata()) fail("the metadata differs");
  std::printf("check %s: %zu tensors, %d mismatches\n", path.c_str(), loaded.size(), mismatches);
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s write DIR | check FILE | write-checkpoint ROOT\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], target = argv[2];
  try {
    if (mode == "write") {
      tandem::accelerate::save_safetensors(target + "/cpp.safetensors", tandem::test::recipe_tensors(),
                                           tandem::test::recipe_metadata());
      auto one_key = tandem::test::recipe_metadata();
      one_key.erase("format");
      tandem::accelerate::save_safetensors(target + "/cpp_one_key.safetensors", tandem::test::recipe_tensors(), one_key);
      return 0;
    }
    if (mode == "check") return check(target);
    if (mode == "write-checkpoint") {
      tandem::accelerate::CheckpointWriter writer(target, tandem::accelerate::checkpoint_name(42));
      tandem::accelerate::save_safetensors(writer.path_for("model.safetensors"), tandem::test::recipe_tensors(),
                                           tandem::test::recipe_metadata());
      writer.add_file("state.json", "{\"step\": 42}\n");
      std::printf("%s\n", writer.commit().c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tandem::one_line(e).c_str());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
