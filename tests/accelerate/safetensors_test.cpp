// safetensors and the checkpoint folder. Oracles: the exact bytes Python's `safetensors` package
// writes (frozen here from safetensors 0.8.0 and its own test suite; the interop test compares
// with the live package), every malformed file with its message word for word, mutated files
// that must fail only with tandem::Error, and CRC-32s from an independent bitwise implementation.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "accelerate/safetensors_recipe.h"
#include "support/errors.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"

namespace fs = std::filesystem;
using tandem::accelerate::CheckpointReader;
using tandem::accelerate::CheckpointWriter;
using tandem::accelerate::checkpoint_name;
using tandem::accelerate::keep_newest;
using tandem::accelerate::list_checkpoints;
using tandem::accelerate::load_safetensors;
using tandem::accelerate::save_safetensors;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

namespace {

/// A fresh folder under the temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem-st-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

/// A safetensors file by hand: the header length, the header, the data.
std::string file_of(const std::string& header, const std::string& data = "") { return le64(header.size()) + header + data; }

/// The raw bytes of a tensor (contiguous).
std::string bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
}

/// CRC-32 (IEEE 802.3, zlib's and Python's zlib.crc32), bit by bit: independent of zlib.
uint32_t reference_crc32(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_same_tensors(const Tensors& actual, const Tensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  std::map<std::string, at::Tensor> by_name(actual.begin(), actual.end());
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(by_name.count(name));
    const at::Tensor& got = by_name[name];
    EXPECT_EQ(got.scalar_type(), want.scalar_type());
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(got.device().is_cpu());
    EXPECT_EQ(bytes_of(got), bytes_of(want));  // bit for bit (NaN, -0 included)
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writing: the package's exact bytes

// The file `safetensors.torch.save_file` (0.8.0) writes for these tensors and metadata: tensors by
// descending dtype alignment then name, the header padded with spaces to a multiple of 8.
TEST(Safetensors, WritesTheBytesThePythonPackageWrites) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  save_safetensors(path,
                   {{"b", at::arange(3, at::kFloat)},
                    {"a", at::zeros({}, at::kChar)},
                    {"c", at::zeros({2}, at::kDouble)},
                    {"e", at::zeros({0, 3}, at::kHalf)},
                    {"d", at::ones({3}, at::kBool)}},
                   {{"k", "v"}});
  const std::string header =
      R"({"__metadata__":{"k":"v"},"c":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[16,28]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[28,28]},)"
      R"("a":{"dtype":"I8","shape":[],"data_offsets":[28,29]},"d":{"dtype":"BOOL","shape":[3],"data_offsets":[29,32]}})"
      "   ";
  const std::string data = std::string(16, '\0') + std::string("\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40", 12) +
                           std::string(1, '\0') + std::string("\x01\x01\x01", 3);
  EXPECT_EQ(header.size(), 304u);
  EXPECT_EQ(read_bytes(path), file_of(header, data));
}

// Every dtype at once: I64 F64 F32 I32 BF16 F16 I16 I8 U8 BOOL, names in byte order ("B" < "a");
// metadata keys sorted, strings escaped as serde_json escapes them (0.8.0's output).
TEST(Safetensors, OrdersTensorsAndEscapesStringsAsThePythonPackage) {
  TempDir dir;
  const std::string path = dir / "order.safetensors";
  Tensors tensors;
  const at::ScalarType types[] = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                                  at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};
  for (int i = 0; i < 10; ++i) tensors.emplace_back("t" + std::to_string(i), at::zeros({1}, types[i]));
  tensors.emplace_back("a_f32", at::zeros({1}));
  tensors.emplace_back("z_f32", at::zeros({1}));
  tensors.emplace_back("B", at::zeros({1}));
  save_safetensors(path, tensors, {{"zz", "1"}, {"aa", "2"}, {"mm", "3"}, {"b", "\n\xc3\xa9\x01\x7f"}});
  const std::string header =
      "{\"__metadata__\":{\"aa\":\"2\",\"b\":\"\\n\xc3\xa9\\u0001\x7f\",\"mm\":\"3\",\"zz\":\"1\"},"
      R"("t4":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"t0":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
      R"("B":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},"a_f32":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
      R"("t1":{"dtype":"F32","shape":[1],"data_offsets":[24,28]},"z_f32":{"dtype":"F32","shape":[1],"data_offsets":[28,32]},)"
      R"("t5":{"dtype":"I32","shape":[1],"data_offsets":[32,36]},"t3":{"dtype":"BF16","shape":[1],"data_offsets":[36,38]},)"
      R"("t2":{"dtype":"F16","shape":[1],"data_offsets":[38,40]},"t6":{"dtype":"I16","shape":[1],"data_offsets":[40,42]},)"
      R"("t7":{"dtype":"I8","shape":[1],"data_offsets":[42,43]},"t8":{"dtype":"U8","shape":[1],"data_offsets":[43,44]},)"
      R"("t9":{"dtype":"BOOL","shape":[1],"data_offsets":[44,45]}})"
      "       ";
  EXPECT_EQ(read_bytes(path), file_of(header, std::string(45, '\0')));
}

// The `safetensors` crate's own test_empty: no tensor, with and without metadata.
TEST(Safetensors, EmptyFilesMatchTheCratesOwnTest) {
  TempDir dir;
  save_safetensors(dir / "e.safetensors", {});
  EXPECT_EQ(read_bytes(dir / "e.safetensors"), file_of("{}      "));
  save_safetensors(dir / "m.safetensors", {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(dir / "m.safetensors"), file_of(R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' ')));
  auto file = load_safetensors(dir / "m.safetensors");
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"framework", "pt"}}));
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripsEveryDtypeAndShape) {
  TempDir dir;
  const auto tensors = tandem::test::recipe_tensors();
  save_safetensors(dir / "all.safetensors", tensors, tandem::test::recipe_metadata());
  auto file = load_safetensors(dir / "all.safetensors");
  expect_same_tensors(file.tensors, tensors);
  EXPECT_EQ(file.metadata, tandem::test::recipe_metadata());
  // Loaded in the order of the data: offsets ascending, so I64 first and BOOL last.
  EXPECT_EQ(file.tensors.front().first, "I64.s0");
  EXPECT_EQ(file.tensors.back().first, "BOOL.s5");
  EXPECT_EQ(file.tensors.front().second.dim(), 0);
}

TEST(Safetensors, WritesContiguousValuesOfAnyView) {
  TempDir dir;
  at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  Tensors views = {{"transposed", base.t()},
                   {"strided", base.slice(1, 0, 6, 2)},
                   {"expanded", at::arange(3, at::kLong).expand({4, 3})},
                   {"offset", base[2]},
                   {"negated", at::_neg_view(base)}};
  save_safetensors(dir / "v.safetensors", views);
  auto file = load_safetensors(dir / "v.safetensors");
  Tensors expected;
  for (const auto& [name, t] : views) expected.emplace_back(name, t.resolve_neg().contiguous());
  expect_same_tensors(file.tensors, expected);
}

TEST(Safetensors, ReplacesAFileAtomicallyAndLeavesNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {{"x", at::zeros({2})}});
  save_safetensors(path, {{"y", at::ones({3}, at::kLong)}});
  auto file = load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].first, "y");
  EXPECT_EQ(entries_of(dir.path()), std::vector<std::string>{"w.safetensors"});
}

// A write that fails midway (the file-size limit stands in for a full disk) leaves the previous
// file as it was and no temporary file behind.
TEST(Safetensors, AFailedWriteLeavesThePreviousFileIntact) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {{"x", at::arange(4, at::kFloat)}});
  const std::string before = read_bytes(path);

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string error = tandem::test::error_of([&] { save_safetensors(path, {{"big", at::zeros({4096})}}); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(error, "save_safetensors " + path + ": cannot write: File too large");
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(entries_of(dir.path()), std::vector<std::string>{"w.safetensors"});
}

TEST(Safetensors, RefusesWhatItCannotWrite) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  const std::string p = "save_safetensors " + path;
  EXPECT_ERROR(save_safetensors(path, {{"u", at::Tensor()}}), p + ": tensor \"u\" is undefined");
  EXPECT_ERROR(save_safetensors(path, {{"c", at::zeros({2}, at::kComplexFloat)}}),
               p + ": tensor \"c\" has dtype ComplexFloat; safetensors files hold F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL");
  EXPECT_ERROR(save_safetensors(path, {{"s", at::eye(3).to_sparse()}}),
               p + ": tensor \"s\" has layout Sparse: safetensors holds dense tensors (call to_dense())");
  EXPECT_ERROR(save_safetensors(path, {{"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}),
               p + ": tensor \"m\" is on the meta device and has no data");
  EXPECT_ERROR(save_safetensors(path, {{"x", at::zeros({1})}, {"x", at::zeros({2})}}), p + ": two tensors are named \"x\"");
  EXPECT_ERROR(save_safetensors(path, {{"__metadata__", at::zeros({1})}}),
               p + ": a tensor cannot be named \"__metadata__\" (the header's metadata key)");
  EXPECT_ERROR(save_safetensors(path, {{"ok", at::zeros({1})}, {"\xff", at::zeros({1})}}),
               p + ": the name of tensor 1 is not valid UTF-8");
  EXPECT_ERROR(save_safetensors(path, {}, {{"k", "\xc3"}}), p + ": metadata \"k\" is not valid UTF-8");
  EXPECT_ERROR_HAS(save_safetensors(dir / "missing/x.safetensors", {}),
                   "save_safetensors " + (dir / "missing/x.safetensors") + ": cannot create " + (dir / "missing/.x.safetensors.tmp-"));
  EXPECT_FALSE(fs::exists(path));
}

// ---------------------------------------------------------------------------------------------
// Reading: every malformed file, word for word

class SafetensorsMalformed : public ::testing::Test {
 protected:
  /// The message load_safetensors gives for a file of these bytes.
  std::string error_for(const std::string& bytes) {
    write_bytes(path_, bytes);
    return tandem::test::error_of([&] { load_safetensors(path_); });
  }
  std::string error_for(const std::string& header, const std::string& data) { return error_for(file_of(header, data)); }
  std::string expected(const std::string& what) const { return "safetensors " + path_ + ": " + what; }

  TempDir dir_;
  std::string path_ = dir_ / "m.safetensors";
};

TEST_F(SafetensorsMalformed, FileAndHeaderLength) {
  EXPECT_EQ(tandem::test::error_of([&] { load_safetensors(dir_ / "absent.safetensors"); }),
            "safetensors " + (dir_ / "absent.safetensors") + ": cannot open: No such file or directory");
  EXPECT_EQ(tandem::test::error_of([&] { load_safetensors(dir_.path()); }),
            "safetensors " + dir_.path() + ": not a regular file");
  EXPECT_EQ(error_for(""), expected("the file has 0 bytes, too few for the 8-byte header length: not a safetensors file"));
  EXPECT_EQ(error_for(std::string("\x02\0\0\0\0", 5)), expected("the file has 5 bytes, too few for the 8-byte header length: not a safetensors file"));
  EXPECT_EQ(error_for(le64(100000001) + "{}"),
            expected("the header length is 100000001, more than the 100000000 bytes allowed: not a safetensors file"));
  EXPECT_EQ(error_for(le64(~0ull)),
            expected("the header length is 18446744073709551615, more than the 100000000 bytes allowed: not a safetensors file"));
  EXPECT_EQ(error_for(le64(100) + "{}"), expected("the header length is 100 but only 2 bytes follow it: the file is truncated"));
  EXPECT_EQ(error_for(le64(0)), expected("the header does not begin with '{': not a safetensors file"));
  EXPECT_EQ(error_for("[]      ", ""), expected("the header does not begin with '{': not a safetensors file"));
  EXPECT_EQ(error_for(" {}     ", ""), expected("the header does not begin with '{': not a safetensors file"));
}

TEST_F(SafetensorsMalformed, InvalidJson) {
  EXPECT_EQ(error_for(R"({"a":   )", ""), expected("the header is not valid JSON (error at byte 9 of 8)"));
  EXPECT_EQ(error_for(R"({"a" 1} )", ""), expected("the header is not valid JSON (error at byte 6 of 8)"));
  EXPECT_EQ(error_for("{}  x   ", ""), expected("the header is not valid JSON (error at byte 5 of 8)"));
  EXPECT_EQ(error_for("{\"\xff\":1}", ""), expected("the header is not valid JSON (error at byte 3 of 7)"));
  EXPECT_EQ(error_for(std::string("{}\0     ", 8), ""), expected("the header is not valid JSON (error at byte 3 of 8)"));
  EXPECT_EQ(error_for(std::string("{\"a\0\":1}", 8), ""), expected("the header is not valid JSON (error at byte 4 of 8)"));
}

TEST_F(SafetensorsMalformed, DuplicateNames) {
  const std::string u8 = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_EQ(error_for(R"({"a":)" + u8 + R"(,"a":)" + u8 + "}", "\x01"), expected("tensor \"a\" appears twice in the header"));
  EXPECT_EQ(error_for(R"({"__metadata__":{},"__metadata__":{}})", ""),
            expected("\"__metadata__\" appears twice in the header"));
  EXPECT_EQ(error_for(R"({"__metadata__":{"k":"1","k":"2"}})", ""), expected("__metadata__ key \"k\" appears twice"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "\x01"),
            expected("tensor \"a\" has the field \"dtype\" twice"));
}

TEST_F(SafetensorsMalformed, Metadata) {
  EXPECT_EQ(error_for(R"({"__metadata__":{"k":1}})", ""), expected("__metadata__ \"k\" is a number, not a string"));
  EXPECT_EQ(error_for(R"({"__metadata__":{"k":["v"]}})", ""), expected("__metadata__ \"k\" is an array, not a string"));
  EXPECT_EQ(error_for(R"({"__metadata__":[]})", ""), expected("\"__metadata__\" is an array, not an object of strings"));
  EXPECT_EQ(error_for(R"({"__metadata__":null})", ""), expected("\"__metadata__\" is null, not an object of strings"));
}

TEST_F(SafetensorsMalformed, TensorEntries) {
  EXPECT_EQ(error_for(R"({"a":5})", ""), expected("tensor \"a\" is a number, not an object with dtype, shape and data_offsets"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","data_offsets":[0,0]}})", ""), expected("tensor \"a\" has no \"shape\""));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1}})", ""),
            expected("tensor \"a\" has an unknown field \"x\" (expected dtype, shape, data_offsets)"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "\x01"),
            expected("tensor \"a\" has dtype \"F8_E4M3\", not one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "abcd"),
            expected("tensor \"a\" has dtype \"f32\", not one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
            expected("tensor \"a\": dtype is a number, not a string such as \"F32\""));
  for (const char* shape : {"[-1]", "[1.5]", "\"3\"", "[[1]]", "null", "[1e2]"}) {
    SCOPED_TRACE(shape);
    EXPECT_EQ(error_for(std::string(R"({"a":{"dtype":"U8","shape":)") + shape + R"(,"data_offsets":[0,0]}})", ""),
              expected("tensor \"a\": shape is not a list of non-negative integers"));
  }
  for (const char* offsets : {"[0]", "[0,1,2]", "[-1,0]", "[0,1.0]", "{}", "[0,18446744073709551616]"}) {
    SCOPED_TRACE(offsets);
    EXPECT_EQ(error_for(std::string(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":)") + offsets + "}}", "\x01"),
              expected("tensor \"a\": data_offsets is not a pair [begin, end] of non-negative integers"));
  }
  // Deep nesting and long arrays end the parse at once: no stack or memory blow-up.
  const int depth = 1000000;
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":)" + std::string(depth, '[') + std::string(depth, ']') +
                      R"(,"data_offsets":[0,0]}})", ""),
            expected("the header nests more than 8 levels deep, which no safetensors header does"));
  std::string objects;
  for (int i = 0; i < depth; ++i) objects += "{\"k\":";
  objects += "1" + std::string(depth, '}');
  EXPECT_EQ(error_for(R"({"__metadata__":{"k":)" + objects + "}}", ""),
            expected("the header nests more than 8 levels deep, which no safetensors header does"));
  EXPECT_EQ(error_for(R"({"__metadata__":{"k":{"k":1}}})", ""), expected("__metadata__ \"k\" is an object, not a string"));
  std::string zeros = "0";
  for (int i = 0; i < depth; ++i) zeros += ",0";
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","data_offsets":[)" + zeros + "]}}", ""),
            expected("the header has an array of more than 64 entries, which no safetensors header has"));
  // A name with a newline is quoted with JSON escapes: the message stays one line.
  EXPECT_EQ(error_for(R"({"a\nb":5})", ""), expected("tensor \"a\\nb\" is a number, not an object with dtype, shape and data_offsets"));
}

TEST_F(SafetensorsMalformed, ShapesAndOffsets) {
  EXPECT_EQ(error_for(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, 'x')),
            expected("tensor \"a\": shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] span 20"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,0]}})", ""),
            expected("tensor \"a\": shape [] of F32 needs 4 bytes but data_offsets [0, 0] span 0"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"),
            expected("tensor \"a\": data_offsets [0, 8] go past the 4 bytes of data after the header"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "abcd"),
            expected("tensor \"a\": data_offsets [4, 0] end before they begin"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
            expected("tensor \"a\": shape [4294967296, 4294967296] has more elements than 64 bits count"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"I64","shape":[3074457345618258603],"data_offsets":[0,0]}})", ""),
            expected("tensor \"a\": shape [3074457345618258603] of I64 has more bytes than 64 bits count"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", ""),
            expected("tensor \"a\": shape [0, 4294967296, 4294967296] is too large for a LibTorch tensor (its strides overflow int64)"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", ""),
            expected("tensor \"a\": shape [0, 9223372036854775808] is too large for a LibTorch tensor (its strides overflow int64)"));
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,2]}})", "ab"),
            expected("tensor \"a\": shape [1, 1, 1, 1, 1, 1, 1, 1, ... (13 dimensions)] of U8 needs 1 bytes but data_offsets [0, 2] span 2"));
}

TEST_F(SafetensorsMalformed, AtMost64Dimensions) {
  std::string ones = "1";
  for (int i = 1; i < 64; ++i) ones += ",1";
  write_bytes(path_, file_of(R"({"a":{"dtype":"U8","shape":[)" + ones + R"(],"data_offsets":[0,1]}})", "\x05"));
  auto file = load_safetensors(path_);
  EXPECT_EQ(file.tensors.at(0).second.dim(), 64);
  EXPECT_EQ(error_for(R"({"a":{"dtype":"U8","shape":[)" + ones + R"(,1],"data_offsets":[0,1]}})", "\x05"),
            expected("tensor \"a\": shape has more than 64 dimensions, more than Tandem reads"));
  EXPECT_ERROR(save_safetensors(path_, {{"b", at::zeros(std::vector<int64_t>(65, 1))}}),
               "save_safetensors " + path_ + ": tensor \"b\" has 65 dimensions; safetensors files here hold at most 64");
  save_safetensors(path_, {{"b", at::zeros(std::vector<int64_t>(64, 1))}});
  EXPECT_EQ(load_safetensors(path_).tensors.at(0).second.dim(), 64);
}

TEST_F(SafetensorsMalformed, LayoutOfTheData) {
  const auto u8 = [](const char* name, int begin, int end) {
    return "\"" + std::string(name) + "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(end - begin) +
           "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  EXPECT_EQ(error_for("{" + u8("a", 0, 4) + "," + u8("b", 2, 6) + "}", "abcdef"),
            expected("tensors \"a\" and \"b\" overlap: data_offsets [0, 4] and [2, 6]"));
  EXPECT_EQ(error_for("{" + u8("b", 0, 4) + "," + u8("a", 0, 4) + "}", "abcd"),
            expected("tensors \"a\" and \"b\" overlap: data_offsets [0, 4] and [0, 4]"));
  EXPECT_EQ(error_for("{" + u8("a", 0, 4) + "," + u8("b", 6, 10) + "}", "abcdefghij"),
            expected("bytes 4 to 6 of the data belong to no tensor (a gap between tensors \"a\" and \"b\")"));
  EXPECT_EQ(error_for("{" + u8("a", 2, 6) + "}", "abcdef"),
            expected("bytes 0 to 2 of the data belong to no tensor (before tensor \"a\")"));
  EXPECT_EQ(error_for("{" + u8("a", 0, 4) + "}", "abcdef"),
            expected("bytes 4 to 6 of the data belong to no tensor (unused bytes after tensor \"a\")"));
  EXPECT_EQ(error_for("{}", "abc"), expected("bytes 0 to 3 of the data belong to no tensor (the header lists no tensor)"));
  // Empty tensors may sit anywhere on the tiling, as the package allows.
  write_bytes(path_, file_of("{" + u8("z", 0, 0) + "," + u8("a", 0, 2) + "," + u8("m", 2, 2) + "," + u8("b", 2, 3) + "}", "abc"));
  auto file = load_safetensors(path_);
  ASSERT_EQ(file.tensors.size(), 4u);
  EXPECT_EQ(file.tensors[0].first + file.tensors[1].first + file.tensors[2].first + file.tensors[3].first, "zamb");
  EXPECT_EQ(bytes_of(file.tensors[1].second), "ab");
}

TEST_F(SafetensorsMalformed, BoolBytes) {
  EXPECT_EQ(error_for(R"({"a":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x02\x00", 3)),
            expected("tensor \"a\": BOOL element 1 is the byte 2, not 0 or 1"));
}

// Python's reader accepts these; a file that lays its tensors out differently from the package
// (here: by name, and with the header not padded) is still a valid file and reads.
TEST_F(SafetensorsMalformed, AcceptsEveryValidLayout) {
  const std::string header = R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"I16","shape":[],"data_offsets":[2,4]},)"
                             R"("__metadata__":{},"c":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})" "\t\n ";
  write_bytes(path_, file_of(header, std::string("\x07\x08\x01\x02", 4)));
  auto file = load_safetensors(path_);
  ASSERT_EQ(file.tensors.size(), 3u);
  EXPECT_EQ(file.tensors[0].first, "c");
  EXPECT_EQ(file.tensors[1].first, "b");
  EXPECT_EQ(file.tensors[2].first, "a");
  EXPECT_EQ(file.tensors[2].second.item<int16_t>(), 0x0201);
  EXPECT_TRUE(file.metadata.empty());
}

// Any damage to a valid file fails with tandem::Error, never with another exception or a crash:
// every truncation, and a few thousand random byte edits.
TEST(Safetensors, DamagedFilesFailOnlyWithOneLineErrors) {
  TempDir dir;
  const std::string path = dir / "d.safetensors";
  Tensors tensors = {{"w", at::arange(6, at::kFloat).reshape({2, 3})},
                     {"m", at::ones({4}, at::kBool)},
                     {"n", at::arange(3, at::kLong)},
                     {"e", at::zeros({0}, at::kHalf)}};
  save_safetensors(path, tensors, {{"k", "v"}});
  const std::string good = read_bytes(path);
  int loaded = 0, refused = 0;
  auto attempt = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    try {
      load_safetensors(path);
      ++loaded;
    } catch (const tandem::Error& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tandem::Error: " << e.what();
    }
  };
  for (size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  EXPECT_EQ(refused, static_cast<int>(good.size()));  // every truncation is refused
  std::mt19937 rng(8);
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      size_t at = rng() % (i % 2 ? bytes.size() : 8 + 140);  // half of the edits land in the header
      bytes[at % bytes.size()] = static_cast<char>(rng() % 256);
    }
    attempt(bytes);
  }
  EXPECT_GT(refused, static_cast<int>(good.size()) + 1000);
  EXPECT_GT(loaded, 0);  // edits of the data bytes still read
}

// ---------------------------------------------------------------------------------------------
// The checkpoint folder

class CheckpointDir : public ::testing::Test {
 protected:
  /// A committed checkpoint with a safetensors file, a JSON file, and a binary file in a subfolder.
  std::string commit_sample(const std::string& name, const std::string& state = R"({"step": 7})") {
    CheckpointWriter writer(root_, name);
    save_safetensors(writer.path_for("model.safetensors"), model_);
    writer.add_file("state.json", state);
    writer.add_file("rank_1/rng.bin", std::string("\x00\xff\x10\n", 4));
    return writer.commit();
  }
  void flip_byte(const std::string& path, size_t at) {
    std::string bytes = read_bytes(path);
    bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
    write_bytes(path, bytes);
  }

  TempDir dir_;
  std::string root_ = dir_ / "ckpt";
  Tensors model_ = {{"fc.weight", at::arange(12, at::kFloat).reshape({3, 4})}, {"fc.bias", at::ones({3})}};
};

TEST_F(CheckpointDir, CommitWritesAManifestThatVerifies) {
  const std::string dir = commit_sample(checkpoint_name(7));
  EXPECT_EQ(dir, root_ + "/checkpoint_000007");
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint_000007"});  // no temporary folder left
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"manifest.json", "model.safetensors", "rank_1", "state.json"}));

  // The manifest, read independently: format, version, time, and each file's size and CRC-32.
  EXPECT_EQ(reference_crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  auto manifest = nlohmann::json::parse(read_bytes(dir + "/manifest.json"));
  EXPECT_EQ(manifest["format"], "tandem-checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_TRUE(std::regex_match(manifest["created"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  ASSERT_EQ(manifest["files"].size(), 3u);
  for (const char* name : {"model.safetensors", "state.json", "rank_1/rng.bin"}) {
    SCOPED_TRACE(name);
    const std::string bytes = read_bytes(dir + "/" + name);
    EXPECT_EQ(manifest["files"][name]["size"], bytes.size());
    EXPECT_EQ("0x" + manifest["files"][name]["crc32"].get<std::string>(), hex(reference_crc32(bytes)));
  }

  CheckpointReader reader(dir);
  ASSERT_EQ(reader.files().size(), 3u);
  EXPECT_EQ(reader.files()[0].name, "model.safetensors");  // ordered by name
  EXPECT_EQ(reader.files()[1].name, "rank_1/rng.bin");
  EXPECT_EQ(reader.files()[1].size, 4u);
  EXPECT_EQ(reader.files()[1].crc32, reference_crc32(std::string("\x00\xff\x10\n", 4)));
  EXPECT_EQ(reader.created(), manifest["created"].get<std::string>());
  EXPECT_EQ(reader.read("state.json"), R"({"step": 7})");
  EXPECT_TRUE(reader.contains("rank_1/rng.bin"));
  EXPECT_FALSE(reader.contains("other"));
  expect_same_tensors(load_safetensors(reader.path("model.safetensors")).tensors, model_);
  EXPECT_ERROR(reader.path("other"), "checkpoint " + dir + ": has no file other (its manifest does not list it)");
}

TEST_F(CheckpointDir, ADamagedFileIsRefused) {
  const std::string dir = commit_sample(checkpoint_name(1));
  const std::string model = dir + "/model.safetensors";
  const uint32_t listed = reference_crc32(read_bytes(model));
  flip_byte(model, fs::file_size(model) - 3);  // a data byte: the file still parses
  const uint32_t now = reference_crc32(read_bytes(model));
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": model.safetensors has CRC-32 " + hex(now) +
                                          " but the manifest says " + hex(listed) + ": the file is damaged");
}

TEST_F(CheckpointDir, ATruncatedFileIsRefused) {
  const std::string dir = commit_sample(checkpoint_name(1));
  const std::string state = dir + "/state.json";
  write_bytes(state, read_bytes(state).substr(0, 5));
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": state.json has 5 bytes but the manifest says 11: the file is damaged");
}

TEST_F(CheckpointDir, AMissingFileIsRefused) {
  const std::string dir = commit_sample(checkpoint_name(1));
  fs::remove(dir + "/rank_1/rng.bin");
  EXPECT_ERROR(CheckpointReader{dir},
               "checkpoint " + dir + ": rank_1/rng.bin is listed in the manifest but missing: the checkpoint is incomplete");
}

TEST_F(CheckpointDir, AMissingOrDamagedManifestIsRefused) {
  const std::string dir = commit_sample(checkpoint_name(1));
  const std::string manifest = read_bytes(dir + "/manifest.json");
  write_bytes(dir + "/manifest.json", manifest.substr(0, 40));
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json is not valid JSON (error at byte 41): the manifest is damaged");
  write_bytes(dir + "/manifest.json", manifest + std::string(1, '\0'));
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json is not valid JSON (error at byte " +
                                          std::to_string(manifest.size() + 1) + "): the manifest is damaged");
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": 2, "created": "x", "files": {}})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json has format version 2, newer than the 1 this Tandem reads: upgrade Tandem");
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": 1, "created": "x", "files": {"../x": {"size": 0, "crc32": "00000000"}}})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json lists \"../x\", which is not a file name inside the checkpoint: the manifest is damaged");
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": 1, "created": "x", "files": {"state.json": {"size": 11, "crc32": 5}}})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json's entry for state.json is not {\"size\": bytes, \"crc32\": \"8 hex digits\"}: the manifest is damaged");
  write_bytes(dir + "/manifest.json", "{}");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json is not a Tandem checkpoint manifest (it lacks \"format\": \"tandem-checkpoint\")");
  // Found by the manifest fuzzer: nlohmann throws out_of_range, not parse_error, for such a number.
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": 1e999})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json is not valid JSON (a number out of range): the manifest is damaged");
  // A version beyond int64_t is named as written, not wrapped to a negative one.
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": 18446744073709551615, "created": "x", "files": {}})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json has format version 18446744073709551615, newer than the 1 this Tandem reads: upgrade Tandem");
  write_bytes(dir + "/manifest.json", R"({"format": "tandem-checkpoint", "version": -3, "created": "x", "files": {}})");
  EXPECT_ERROR(CheckpointReader{dir}, "checkpoint " + dir + ": manifest.json has format version -3, not 1");
  fs::remove(dir + "/manifest.json");
  EXPECT_ERROR(CheckpointReader{dir},
               "checkpoint " + dir + ": no manifest.json: the checkpoint was never committed, or this is not a checkpoint folder");
  EXPECT_ERROR(CheckpointReader{root_ + "/nothing"}, "checkpoint " + root_ + "/nothing: does not exist");
}

TEST_F(CheckpointDir, AFileChangedAfterOpeningIsRefusedOnRead) {
  const std::string dir = commit_sample(checkpoint_name(1));
  CheckpointReader reader(dir);
  const uint32_t listed = reference_crc32(R"({"step": 7})");
  write_bytes(dir + "/state.json", R"({"step": 8})");
  EXPECT_ERROR(reader.read("state.json"), "checkpoint " + dir + ": state.json has CRC-32 " + hex(reference_crc32(R"({"step": 8})")) +
                                              " but the manifest says " + hex(listed) + ": the file is damaged");
  write_bytes(dir + "/state.json", "{}");
  EXPECT_ERROR(reader.read("state.json"), "checkpoint " + dir +
                                              ": state.json no longer has the 11 bytes the manifest says: the file was changed after the checkpoint was opened");
}

TEST_F(CheckpointDir, AnUncommittedWriterLeavesNothing) {
  {
    CheckpointWriter writer(root_, checkpoint_name(3));
    writer.add_file("state.json", "{}");
    save_safetensors(writer.path_for("model.safetensors"), model_);
    EXPECT_TRUE(fs::is_directory(writer.temporary_dir()));
    EXPECT_EQ(writer.temporary_dir(), root_ + "/.tmp-checkpoint_000003-" + std::to_string(::getpid()));
  }
  EXPECT_TRUE(entries_of(root_).empty());
  {
    CheckpointWriter writer(root_, checkpoint_name(4));
    writer.path_for("model.safetensors");  // promised, never written
    EXPECT_ERROR(writer.commit(), "checkpoint " + root_ + "/checkpoint_000004: model.safetensors was never written (path_for() promised it)");
  }
  EXPECT_TRUE(entries_of(root_).empty());
  EXPECT_TRUE(list_checkpoints(root_).empty());
}

// A process that dies before commit() (here: a writer never destroyed) leaves only its hidden
// temporary folder: the previous checkpoint of the same name is untouched and still verifies.
TEST_F(CheckpointDir, ACrashBeforeCommitLeavesThePreviousCheckpoint) {
  const std::string dir = commit_sample(checkpoint_name(5));
  auto* crashed = new CheckpointWriter(root_, checkpoint_name(5));
  crashed->add_file("state.json", "{\"step\": 999}");
  auto* crashed_next = new CheckpointWriter(root_, checkpoint_name(6));
  crashed_next->add_file("state.json", "{}");
  EXPECT_EQ(list_checkpoints(root_), std::vector<std::string>{dir});
  CheckpointReader reader(dir);
  EXPECT_EQ(reader.read("state.json"), R"({"step": 7})");
  delete crashed;
  delete crashed_next;
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint_000005"});
}

TEST_F(CheckpointDir, CommittingAnExistingNameReplacesTheWholeCheckpoint) {
  commit_sample(checkpoint_name(2));
  CheckpointWriter writer(root_, checkpoint_name(2));
  writer.add_file("only.txt", "new");
  const std::string dir = writer.commit();
  CheckpointReader reader(dir);
  ASSERT_EQ(reader.files().size(), 1u);
  EXPECT_EQ(reader.read("only.txt"), "new");
  EXPECT_FALSE(fs::exists(dir + "/state.json"));
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint_000002"});  // nothing hidden left over
}

TEST_F(CheckpointDir, SomethingElseByTheSameNameIsLeftAlone) {
  fs::create_directories(root_ + "/checkpoint_000003");
  write_bytes(root_ + "/checkpoint_000003/keep.txt", "mine");
  {
    CheckpointWriter writer(root_, checkpoint_name(3));
    writer.add_file("state.json", "{}");
    EXPECT_ERROR(writer.commit(), "checkpoint " + root_ + "/checkpoint_000003: " + root_ +
                                      "/checkpoint_000003 exists and is not a checkpoint (it has no manifest.json): it was left "
                                      "alone; remove it or choose another name");
  }
  EXPECT_EQ(read_bytes(root_ + "/checkpoint_000003/keep.txt"), "mine");
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint_000003"});
}

TEST_F(CheckpointDir, RefusesBadNames) {
  const std::string c = "checkpoint " + root_ + "/";
  EXPECT_ERROR(CheckpointWriter(root_, "a/b"), c + "a/b: the name \"a/b\" must be one folder name, not starting with '.'");
  EXPECT_ERROR(CheckpointWriter(root_, ".hidden"), c + ".hidden: the name \".hidden\" must be one folder name, not starting with '.'");
  EXPECT_ERROR(CheckpointWriter(root_, ""), c + ": the name \"\" must be one folder name, not starting with '.'");
  EXPECT_ERROR(CheckpointWriter("", "x"), "checkpoint x: the root folder is empty: pass a folder such as \"checkpoints\"");
  CheckpointWriter writer(root_, "named");
  const std::string w = c + "named: ";
  for (const char* bad : {"../x", "/etc/x", "a//b", "a/./b", "x/", ""}) {
    EXPECT_ERROR(writer.add_file(bad, "x"), w + "\"" + bad +
                                                "\" is not a file name inside the checkpoint ('/'-separated parts, none empty, \".\" or \"..\")");
  }
  EXPECT_ERROR(writer.add_file("manifest.json", "{}"), w + "manifest.json is written by commit(), not by the caller");
  writer.commit();
  EXPECT_ERROR(writer.add_file("late.txt", "x"), w + "already committed: files can no longer be added");
  EXPECT_ERROR(writer.commit(), w + "already committed");
  EXPECT_ERROR(checkpoint_name(-1), "checkpoint_name: step -1 is negative: steps count from 0");
}

TEST_F(CheckpointDir, NamesAndListsCheckpointsByStep) {
  EXPECT_EQ(checkpoint_name(0), "checkpoint_000000");
  EXPECT_EQ(checkpoint_name(120), "checkpoint_000120");
  EXPECT_EQ(checkpoint_name(12345678), "checkpoint_12345678");
  EXPECT_TRUE(list_checkpoints(root_).empty());  // no root yet
  for (const char* name : {"checkpoint_10", "checkpoint_9", "checkpoint_000100", "checkpoint_2", "checkpoint_99999999999999999999999"}) {
    CheckpointWriter writer(root_, name);
    writer.add_file("state.json", name);
    writer.commit();
  }
  // Not checkpoints: a writer's temporary folder, a folder without a manifest, other names, a file.
  fs::create_directories(root_ + "/.tmp-checkpoint_5-123");
  write_bytes(root_ + "/.tmp-checkpoint_5-123/manifest.json", "{}");
  fs::create_directories(root_ + "/checkpoint_7");
  fs::create_directories(root_ + "/checkpoint_x1");
  fs::create_directories(root_ + "/checkpoint_");
  fs::create_directories(root_ + "/other");
  write_bytes(root_ + "/checkpoint_8", "a file");
  EXPECT_EQ(list_checkpoints(root_),
            (std::vector<std::string>{root_ + "/checkpoint_2", root_ + "/checkpoint_9", root_ + "/checkpoint_10",
                                      root_ + "/checkpoint_000100", root_ + "/checkpoint_99999999999999999999999"}));
}

TEST_F(CheckpointDir, KeepNewestAppliesTheTotalLimit) {
  for (int step = 1; step <= 5; ++step) commit_sample(checkpoint_name(step * 10));
  write_bytes(root_ + "/notes.txt", "not a checkpoint");
  keep_newest(root_, 7);  // fewer than the limit: nothing to do
  EXPECT_EQ(list_checkpoints(root_).size(), 5u);
  keep_newest(root_, 2);
  EXPECT_EQ(list_checkpoints(root_), (std::vector<std::string>{root_ + "/checkpoint_000040", root_ + "/checkpoint_000050"}));
  EXPECT_EQ(entries_of(root_), (std::vector<std::string>{"checkpoint_000040", "checkpoint_000050", "notes.txt"}));
  CheckpointReader(root_ + "/checkpoint_000050");
  keep_newest(root_, 1);
  EXPECT_EQ(list_checkpoints(root_), std::vector<std::string>{root_ + "/checkpoint_000050"});
  EXPECT_ERROR(keep_newest(root_, 0), "keep_newest " + root_ + ": keeping 0 checkpoints would delete every one: keep at least 1");
  EXPECT_EQ(list_checkpoints(root_).size(), 1u);
}
