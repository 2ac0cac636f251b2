// The IDX reader and the Fashion-MNIST dataset: small IDX files written here (plain and gzip)
// round-trip exactly; every malformed input gets its one-line message, word for word; Debian's
// real files match values Python computed from the same .gz files.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/samplers/random.h>
#include <torch/data/transforms/stack.h>

#include "support/errors.h"
#include "tandem/data/fashion_mnist.h"
#include "tandem/data/idx.h"

using tandem::data::read_idx;
using Bytes = std::string;

namespace {

const std::string kDebianRoot = tandem::data::kFashionMnistRoot;

// The header of an IDX file: 00 00 type rank, then each dimension big-endian.
Bytes idx_header(uint8_t type, const std::vector<uint32_t>& dims) {
  Bytes out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out += static_cast<char>((d >> shift) & 0xFF);
  }
  return out;
}

Bytes counting_bytes(size_t n) {
  Bytes out;
  for (size_t i = 0; i < n; ++i) out += static_cast<char>(i % 251);
  return out;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

Bytes read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

bool debian_dataset_present() {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"}) {
    if (!std::filesystem::exists(kDebianRoot + "/" + name)) return false;
  }
  return true;
}

#define SKIP_WITHOUT_DEBIAN_DATASET()                                                                   \
  if (!debian_dataset_present())                                                                        \
  GTEST_SKIP() << kDebianRoot << " lacks the four Fashion-MNIST files "                               \
               << "(apt-get install dataset-fashion-mnist, or scripts/setup)"

// A fresh folder per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tandem-idx-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

class Idx : public TempDirTest {};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(Idx, PlainUint8RoundTrips) {
  write_plain(path("a.idx"), idx_header(0x08, {2, 3, 4}) + counting_bytes(24));
  at::Tensor t = read_idx(path("a.idx"));
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_EQ(t.sizes(), at::IntArrayRef({2, 3, 4}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(at::equal(t, at::arange(24, at::kByte).view({2, 3, 4})));
}

TEST_F(Idx, GzipUint8RoundTripsWhateverTheName) {
  const Bytes content = idx_header(0x08, {300, 7}) + counting_bytes(2100);
  write_gzip(path("gzip-named-plain.idx"), content);
  write_plain(path("plain-named.gz"), content);
  at::Tensor expected = at::arange(2100, at::kLong).remainder(251).to(at::kByte).view({300, 7});
  EXPECT_TRUE(at::equal(read_idx(path("gzip-named-plain.idx")), expected));
  EXPECT_TRUE(at::equal(read_idx(path("plain-named.gz")), expected));
}

TEST_F(Idx, BytesAfterTheGzipStreamAreIgnoredAsByGunzip) {
  // zlib, like gunzip, stops at the end of the gzip stream when what follows is not gzip.
  write_gzip(path("a.gz"), idx_header(0x08, {3}) + "abc");
  write_plain(path("a.gz"), read_plain(path("a.gz")) + "not gzip");
  EXPECT_TRUE(at::equal(read_idx(path("a.gz")), at::tensor({97, 98, 99}, at::kByte)));
}

TEST_F(Idx, OneToFourDimensions) {
  const std::vector<std::vector<uint32_t>> shapes = {{5}, {2, 3}, {1, 2, 3}, {2, 1, 3, 2}};
  for (const auto& dims : shapes) {
    size_t n = 1;
    for (uint32_t d : dims) n *= d;
    write_gzip(path("d.gz"), idx_header(0x08, dims) + counting_bytes(n));
    at::Tensor t = read_idx(path("d.gz"));
    EXPECT_EQ(t.sizes(), at::IntArrayRef(std::vector<int64_t>(dims.begin(), dims.end())));
    EXPECT_EQ(t.sum().item<int64_t>(), static_cast<int64_t>(n * (n - 1) / 2));
  }
}

TEST_F(Idx, MultiByteTypesAreBigEndian) {
  // int8 -2, 127; int16 -2, 258; int32 -2, 16909060; float32 1.5, -2; float64 0.25, -3.
  write_plain(path("i8"), idx_header(0x09, {2}) + Bytes("\xfe\x7f", 2));
  write_plain(path("i16"), idx_header(0x0B, {2}) + Bytes("\xff\xfe\x01\x02", 4));
  write_gzip(path("i32"), idx_header(0x0C, {2}) + Bytes("\xff\xff\xff\xfe\x01\x02\x03\x04", 8));
  write_plain(path("f32"), idx_header(0x0D, {2}) + Bytes("\x3f\xc0\x00\x00\xc0\x00\x00\x00", 8));
  write_gzip(path("f64"), idx_header(0x0E, {1, 2}) +
                              Bytes("\x3f\xd0\x00\x00\x00\x00\x00\x00\xc0\x08\x00\x00\x00\x00\x00\x00", 16));
  EXPECT_TRUE(at::equal(read_idx(path("i8")), at::tensor({-2, 127}, at::kChar)));
  EXPECT_TRUE(at::equal(read_idx(path("i16")), at::tensor({-2, 258}, at::kShort)));
  EXPECT_TRUE(at::equal(read_idx(path("i32")), at::tensor({-2, 16909060}, at::kInt)));
  EXPECT_TRUE(at::equal(read_idx(path("f32")), at::tensor({1.5f, -2.0f}, at::kFloat)));
  EXPECT_TRUE(at::equal(read_idx(path("f64")), at::tensor({0.25, -3.0}, at::kDouble).view({1, 2})));
}

TEST_F(Idx, DataAboveOneMiBRoundTrips) {  // the reader grows its buffer in steps from 1 MiB
  const size_t n = 3 * (1 << 20) + 17;
  write_gzip(path("big.gz"), idx_header(0x08, {static_cast<uint32_t>(n)}) + counting_bytes(n));
  at::Tensor t = read_idx(path("big.gz"));
  EXPECT_TRUE(at::equal(t, at::arange(static_cast<int64_t>(n), at::kLong).remainder(251).to(at::kByte)));
}

// ---------------------------------------------------------------------------------------------
// Every malformed input: one line, naming the file, saying what was expected.

TEST_F(Idx, MissingFile) {
  EXPECT_ERROR(read_idx(path("absent.gz")),
               "IDX file " + path("absent.gz") + ": cannot open it (No such file or directory)");
}

TEST_F(Idx, DirectoryIsNotAFile) {
  EXPECT_ERROR(read_idx(dir_), "IDX file " + dir_ + ": not a regular file");
}

TEST_F(Idx, EmptyAndTooShortForTheMagic) {
  const std::string expected_tail =
      " bytes; an IDX file starts with a 4-byte magic: 00 00, a type code, the number of dimensions)";
  write_plain(path("empty"), "");
  EXPECT_ERROR(read_idx(path("empty")), "IDX file " + path("empty") + ": not an IDX file (it holds 0" + expected_tail);
  write_gzip(path("empty.gz"), "");
  EXPECT_ERROR(read_idx(path("empty.gz")),
               "IDX file " + path("empty.gz") + ": not an IDX file (it holds 0" + expected_tail);
  write_gzip(path("two.gz"), Bytes("\0\0", 2));
  EXPECT_ERROR(read_idx(path("two.gz")),
               "IDX file " + path("two.gz") + ": not an IDX file (it holds 2" + expected_tail);
}

TEST_F(Idx, BadMagic) {
  write_plain(path("png"), "\x89PNG\r\n\x1a\n" + counting_bytes(100));
  EXPECT_ERROR(read_idx(path("png")), "IDX file " + path("png") +
                                          ": not an IDX file (it starts with 89 50 4e 47; an IDX file starts with "
                                          "00 00, a type code, the number of dimensions)");
  write_gzip(path("half.gz"), Bytes("\0\x01\x08\x01", 4) + counting_bytes(10));
  EXPECT_ERROR(read_idx(path("half.gz")), "IDX file " + path("half.gz") +
                                              ": not an IDX file (it starts with 00 01 08 01; an IDX file starts "
                                              "with 00 00, a type code, the number of dimensions)");
}

TEST_F(Idx, UnsupportedElementType) {
  write_plain(path("t"), idx_header(0x0A, {4}) + counting_bytes(4));
  EXPECT_ERROR(read_idx(path("t")), "IDX file " + path("t") +
                                        ": unsupported element type 0x0a (expected 0x08 uint8, 0x09 int8, 0x0b "
                                        "int16, 0x0c int32, 0x0d float32 or 0x0e float64)");
}

TEST_F(Idx, NumberOfDimensionsOutsideOneToFour) {
  write_plain(path("zero"), Bytes("\0\0\x08\0", 4));
  EXPECT_ERROR(read_idx(path("zero")), "IDX file " + path("zero") + ": the header says 0 dimensions (expected 1 to 4)");
  write_gzip(path("five.gz"), idx_header(0x08, {1, 1, 1, 1, 1}) + "x");
  EXPECT_ERROR(read_idx(path("five.gz")),
               "IDX file " + path("five.gz") + ": the header says 5 dimensions (expected 1 to 4)");
  write_plain(path("255"), Bytes("\0\0\x08\xff", 4));
  EXPECT_ERROR(read_idx(path("255")), "IDX file " + path("255") + ": the header says 255 dimensions (expected 1 to 4)");
}

TEST_F(Idx, TruncatedHeader) {
  write_gzip(path("h.gz"), idx_header(0x08, {10, 28, 28}).substr(0, 9));
  EXPECT_ERROR(read_idx(path("h.gz")), "IDX file " + path("h.gz") +
                                           ": truncated header (3 dimensions need 12 bytes after the magic, the "
                                           "file has 5)");
}

TEST_F(Idx, ZeroDimension) {
  write_plain(path("z"), idx_header(0x08, {10, 0, 28}));
  EXPECT_ERROR(read_idx(path("z")),
               "IDX file " + path("z") + ": dimensions 10 x 0 x 28 (expected every dimension to be at least 1)");
}

TEST_F(Idx, TwoGiBOrMoreIsRefusedBeforeAnyAllocation) {
  // Exactly 2^31 bytes: refused.
  write_plain(path("2g"), idx_header(0x08, {65536, 32768}));
  EXPECT_ERROR(read_idx(path("2g")), "IDX file " + path("2g") +
                                         ": dimensions 65536 x 32768 of 1-byte elements make 2 GiB of data or "
                                         "more (expected less than 2 GiB)");
  write_gzip(path("f64.gz"), idx_header(0x0E, {16384, 16384}));
  EXPECT_ERROR(read_idx(path("f64.gz")), "IDX file " + path("f64.gz") +
                                             ": dimensions 16384 x 16384 of 8-byte elements make 2 GiB of data or "
                                             "more (expected less than 2 GiB)");
  // Four dimensions of 2^32 - 1: a product that would overflow 64 bits.
  write_plain(path("max"), idx_header(0x0C, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}));
  EXPECT_ERROR(read_idx(path("max")), "IDX file " + path("max") +
                                          ": dimensions 4294967295 x 4294967295 x 4294967295 x 4294967295 of "
                                          "4-byte elements make 2 GiB of data or more (expected less than 2 GiB)");
  // One element less than 2 GiB passes the size check; the missing data is what is reported.
  write_plain(path("under"), idx_header(0x08, {65536, 32767}) + "abc");
  EXPECT_ERROR(read_idx(path("under")), "IDX file " + path("under") +
                                            ": truncated (dimensions 65536 x 32767 need 2147418112 bytes of data, "
                                            "the file has 3)");
}

TEST_F(Idx, TruncatedData) {
  write_plain(path("t"), idx_header(0x08, {3, 28, 28}) + counting_bytes(2000));
  EXPECT_ERROR(read_idx(path("t")),
               "IDX file " + path("t") +
                   ": truncated (dimensions 3 x 28 x 28 need 2352 bytes of data, the file has 2000)");
  write_gzip(path("t.gz"), idx_header(0x0C, {5}) + counting_bytes(19));
  EXPECT_ERROR(read_idx(path("t.gz")),
               "IDX file " + path("t.gz") + ": truncated (dimensions 5 need 20 bytes of data, the file has 19)");
  write_gzip(path("none.gz"), idx_header(0x08, {60000}));
  EXPECT_ERROR(read_idx(path("none.gz")),
               "IDX file " + path("none.gz") +
                   ": truncated (dimensions 60000 need 60000 bytes of data, the file has 0)");
}

TEST_F(Idx, TrailingGarbage) {
  write_plain(path("g"), idx_header(0x08, {2, 2}) + counting_bytes(4) + "junk");
  EXPECT_ERROR(read_idx(path("g")), "IDX file " + path("g") +
                                        ": 4 bytes after the 4 bytes of data for dimensions 2 x 2 (expected the "
                                        "file to end there)");
  write_gzip(path("g.gz"), idx_header(0x08, {10}) + counting_bytes(10 + 100000));
  EXPECT_ERROR(read_idx(path("g.gz")), "IDX file " + path("g.gz") +
                                           ": 100000 bytes after the 10 bytes of data for dimensions 10 (expected "
                                           "the file to end there)");
}

TEST_F(Idx, CorruptGzip) {
  const Bytes content = idx_header(0x08, {1000}) + counting_bytes(1000);
  write_gzip(path("ok.gz"), content);
  const Bytes gz = read_plain(path("ok.gz"));
  ASSERT_GT(gz.size(), 30u);

  // The gzip trailer: CRC-32 then the length, 8 bytes. A wrong CRC: the data decompress, the check fails.
  Bytes bad_crc = gz;
  bad_crc[gz.size() - 8] ^= 0x01;
  write_plain(path("crc.gz"), bad_crc);
  EXPECT_ERROR(read_idx(path("crc.gz")),
               "IDX file " + path("crc.gz") + ": corrupt gzip data (zlib: incorrect data check)");

  // Cut in the middle of the deflate stream.
  write_plain(path("cut.gz"), gz.substr(0, gz.size() / 2));
  EXPECT_ERROR(read_idx(path("cut.gz")),
               "IDX file " + path("cut.gz") + ": corrupt gzip data (zlib: unexpected end of file)");

  // Only the trailer missing: every data byte is there, and still the stream is refused.
  write_plain(path("notrailer.gz"), gz.substr(0, gz.size() - 8));
  EXPECT_ERROR(read_idx(path("notrailer.gz")),
               "IDX file " + path("notrailer.gz") + ": corrupt gzip data (zlib: unexpected end of file)");

  // A deflate block type 3 (reserved) right after the 10-byte gzip header.
  Bytes bad_block = gz;
  bad_block[10] = static_cast<char>(0x07);
  write_plain(path("block.gz"), bad_block);
  EXPECT_ERROR(read_idx(path("block.gz")),
               "IDX file " + path("block.gz") + ": corrupt gzip data (zlib: invalid block type)");
}

TEST_F(Idx, NoByteFlipCrashes) {
  // Every single-byte change of a small gzip IDX file: read_idx returns or throws tandem::Error.
  const Bytes content = idx_header(0x08, {4, 5}) + counting_bytes(20);
  write_gzip(path("ok.gz"), content);
  const Bytes gz = read_plain(path("ok.gz"));
  for (const Bytes& original : {content, gz}) {
    for (size_t i = 0; i < original.size(); ++i) {
      for (int flip : {0x01, 0x80, 0xFF}) {
        Bytes changed = original;
        changed[i] = static_cast<char>(changed[i] ^ flip);
        write_plain(path("f"), changed);
        try {
          at::Tensor t = read_idx(path("f"));
          EXPECT_EQ(t.numel() * static_cast<int64_t>(t.element_size()), 20) << "byte " << i;
        } catch (const tandem::Error& e) {
          EXPECT_THAT(e.what(), ::testing::StartsWith("IDX file " + path("f") + ": "));
          EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Debian's files: values computed by Python's gzip module from the same files (an independent
// reader), e.g.
//   python3 -c "import gzip; d=gzip.open('.../t10k-labels-idx1-ubyte.gz').read(); print(list(d[8:28]))"
//   python3 -c "import gzip; d=gzip.open('.../t10k-images-idx3-ubyte.gz').read(); print(sum(d[16:16+784]))"

TEST(IdxDebian, FashionMnistFilesMatchPython) {
  SKIP_WITHOUT_DEBIAN_DATASET();
  at::Tensor test_labels = read_idx(kDebianRoot + "/t10k-labels-idx1-ubyte.gz");
  at::Tensor test_images = read_idx(kDebianRoot + "/t10k-images-idx3-ubyte.gz");
  at::Tensor train_labels = read_idx(kDebianRoot + "/train-labels-idx1-ubyte.gz");
  at::Tensor train_images = read_idx(kDebianRoot + "/train-images-idx3-ubyte.gz");
  EXPECT_EQ(test_labels.sizes(), at::IntArrayRef({10000}));
  EXPECT_EQ(test_images.sizes(), at::IntArrayRef({10000, 28, 28}));
  EXPECT_EQ(train_labels.sizes(), at::IntArrayRef({60000}));
  EXPECT_EQ(train_images.sizes(), at::IntArrayRef({60000, 28, 28}));

  const std::vector<int64_t> first_20 = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5, 7, 3, 4, 1, 2, 4, 8, 0};
  at::Tensor head = test_labels.slice(0, 0, 20).to(at::kLong);
  EXPECT_EQ(std::vector<int64_t>(head.data_ptr<int64_t>(), head.data_ptr<int64_t>() + 20), first_20);
  EXPECT_EQ(test_images[0].sum(at::kLong).item<int64_t>(), 33456);
  EXPECT_EQ(train_images[0].sum(at::kLong).item<int64_t>(), 76247);
  EXPECT_EQ(test_images.sum(at::kLong).item<int64_t>(), 573469082);
  EXPECT_EQ(train_images.sum(at::kLong).item<int64_t>(), 3431114169);
  for (const at::Tensor& images : {train_images, test_images}) {  // the bytes span the whole 0..255
    EXPECT_EQ(images.min().item<int64_t>(), 0);
    EXPECT_EQ(images.max().item<int64_t>(), 255);
  }
}

// ---------------------------------------------------------------------------------------------
// FashionMnist on small fake files: the normalisation, the accessors, and every check.

namespace {

class FashionMnistFake : public TempDirTest {
 protected:
  // Writes the `prefix` split: images of `image_dims` (byte k of the data, in image i, is (i + k) % 256)
  // and `labels`.
  void write_split(const std::string& prefix, const std::vector<uint32_t>& image_dims, const Bytes& labels) {
    size_t n = 1;
    for (uint32_t d : image_dims) n *= d;
    Bytes pixels;
    for (size_t k = 0; k < n; ++k) pixels += static_cast<char>((k / (n / image_dims[0]) + k) % 256);
    write_gzip(path(prefix + "-images-idx3-ubyte.gz"), idx_header(0x08, image_dims) + pixels);
    write_gzip(path(prefix + "-labels-idx1-ubyte.gz"),
               idx_header(0x08, {static_cast<uint32_t>(labels.size())}) + labels);
  }
  tandem::data::FashionMnist load(tandem::data::Split split = tandem::data::Split::Test) {
    return tandem::data::FashionMnist(tandem::data::FashionMnistOptions().root(dir_).split(split));
  }
};

float normalised(int byte) {
  return static_cast<float>((byte / 255.0 - tandem::data::kFashionMnistMean) / tandem::data::kFashionMnistStd);
}

}  // namespace

TEST_F(FashionMnistFake, ImagesAreNormalisedFloatsAndTargetsInt64) {
  write_split("t10k", {3, 28, 28}, Bytes("\x09\x00\x04", 3));
  auto data = load();
  EXPECT_EQ(data.size().value(), 3u);
  EXPECT_EQ(data.images().sizes(), at::IntArrayRef({3, 1, 28, 28}));
  EXPECT_EQ(data.images().scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(data.targets(), at::tensor({9, 0, 4}, at::kLong)));
  auto example = data.get(2);
  EXPECT_EQ(example.data.sizes(), at::IntArrayRef({1, 28, 28}));
  EXPECT_EQ(example.target.dim(), 0);
  EXPECT_EQ(example.target.item<int64_t>(), 4);
  // Image 2, pixel (r, c): byte (2 + 28 r + c + 2 * 784) % 256.
  for (int64_t r : {0, 13, 27}) {
    for (int64_t c : {0, 5, 27}) {
      int byte = static_cast<int>((2 + 28 * r + c + 2 * 784) % 256);
      EXPECT_EQ(example.data[0][r][c].item<float>(), normalised(byte)) << r << "," << c;
    }
  }
  EXPECT_FLOAT_EQ(normalised(0), -0.8101983f);
  EXPECT_FLOAT_EQ(normalised(255), 2.0226629f);
}

TEST_F(FashionMnistFake, TrainSplitReadsTheTrainFiles) {
  write_split("train", {2, 28, 28}, Bytes("\x01\x02", 2));
  write_split("t10k", {1, 28, 28}, Bytes("\x03", 1));
  EXPECT_EQ(load(tandem::data::Split::Train).size().value(), 2u);
  EXPECT_EQ(tandem::data::FashionMnist(tandem::data::FashionMnistOptions().root(dir_)).targets()[1].item<int64_t>(), 2);
  EXPECT_EQ(load(tandem::data::Split::Test).size().value(), 1u);
}

TEST_F(FashionMnistFake, WorksInALibTorchLoader) {
  write_split("t10k", {5, 28, 28}, Bytes("\x00\x01\x02\x03\x04", 5));
  // As docs/guide-data.md shows it: the default (random) sampler, batches of 2.
  auto loader = torch::data::make_data_loader(load().map(torch::data::transforms::Stack<>()), 2);
  std::vector<int64_t> targets;
  for (auto& batch : *loader) {
    EXPECT_EQ(batch.data.sizes().slice(1), at::IntArrayRef({1, 28, 28}));
    for (int64_t i = 0; i < batch.target.size(0); ++i) targets.push_back(batch.target[i].item<int64_t>());
  }
  std::sort(targets.begin(), targets.end());
  EXPECT_EQ(targets, std::vector<int64_t>({0, 1, 2, 3, 4}));
}

TEST_F(FashionMnistFake, IndexOutOfRange) {
  write_split("t10k", {2, 28, 28}, Bytes("\x00\x01", 2));
  auto data = load();
  EXPECT_ERROR(data.get(2), "Fashion-MNIST: index 2 is out of range (the test split has 2 examples)");
}

TEST_F(FashionMnistFake, MissingDatasetSaysHowToInstall) {
  EXPECT_ERROR(load(tandem::data::Split::Train),
               "Fashion-MNIST: " + path("train-images-idx3-ubyte.gz") +
                   " not found (install the dataset: apt-get install dataset-fashion-mnist, or scripts/setup; or "
                   "set FashionMnistOptions::root to a folder with the four IDX files)");
  write_split("t10k", {2, 28, 28}, Bytes("\x00\x01", 2));
  std::filesystem::remove(path("t10k-labels-idx1-ubyte.gz"));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-labels-idx1-ubyte.gz") +
                           " not found (install the dataset: apt-get install dataset-fashion-mnist, or scripts/setup; "
                           "or set FashionMnistOptions::root to a folder with the four IDX files)");
}

TEST_F(FashionMnistFake, ImageCountMustEqualLabelCount) {
  write_split("t10k", {3, 28, 28}, Bytes("\x00\x01", 2));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-labels-idx1-ubyte.gz") + " holds 2 labels but " +
                           path("t10k-images-idx3-ubyte.gz") + " holds 3 images (expected one label per image)");
}

TEST_F(FashionMnistFake, ImagesMustBe28By28) {
  write_split("t10k", {2, 32, 32}, Bytes("\x00\x01", 2));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-images-idx3-ubyte.gz") +
                           " holds an array of 2 x 32 x 32 (expected N x 28 x 28 images)");
  write_split("t10k", {2, 784}, Bytes("\x00\x01", 2));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-images-idx3-ubyte.gz") +
                           " holds an array of 2 x 784 (expected N x 28 x 28 images)");
}

TEST_F(FashionMnistFake, ImagesAndLabelsMustBeBytes) {
  write_split("t10k", {1, 28, 28}, Bytes("\x00", 1));
  write_gzip(path("t10k-images-idx3-ubyte.gz"), idx_header(0x0D, {1, 28, 28}) + Bytes(4 * 784, '\0'));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-images-idx3-ubyte.gz") +
                           " holds elements of type Float (expected unsigned bytes, IDX type 0x08)");
  write_split("t10k", {1, 28, 28}, Bytes("\x00", 1));
  write_gzip(path("t10k-labels-idx1-ubyte.gz"), idx_header(0x0C, {1}) + Bytes(4, '\0'));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-labels-idx1-ubyte.gz") +
                           " holds elements of type Int (expected unsigned bytes, IDX type 0x08)");
  write_split("t10k", {1, 28, 28}, Bytes("\x00", 1));
  write_gzip(path("t10k-labels-idx1-ubyte.gz"), idx_header(0x08, {1, 1}) + Bytes(1, '\0'));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-labels-idx1-ubyte.gz") +
                           " holds an array of 1 x 1 (expected one dimension: N labels)");
}

TEST_F(FashionMnistFake, LabelsMustBeZeroToNine) {
  write_split("t10k", {4, 28, 28}, Bytes("\x00\x09\x0a\x03", 4));
  EXPECT_ERROR(load(), "Fashion-MNIST: " + path("t10k-labels-idx1-ubyte.gz") +
                           " holds the label 10 at index 2 (expected 0 to 9)");
}

TEST_F(FashionMnistFake, MalformedFilesReportTheReadersMessage) {
  write_split("t10k", {2, 28, 28}, Bytes("\x00\x01", 2));
  const Bytes gz = read_plain(path("t10k-images-idx3-ubyte.gz"));
  write_plain(path("t10k-images-idx3-ubyte.gz"), gz.substr(0, gz.size() - 8));
  EXPECT_ERROR(load(), "IDX file " + path("t10k-images-idx3-ubyte.gz") +
                           ": corrupt gzip data (zlib: unexpected end of file)");
}

// ---------------------------------------------------------------------------------------------
// FashionMnist on Debian's files.

TEST(FashionMnistDebian, TrainAndTestSplits) {
  SKIP_WITHOUT_DEBIAN_DATASET();
  struct Expected {
    tandem::data::Split split;
    int64_t size;
    int64_t per_class;
  };
  for (const auto& expected : {Expected{tandem::data::Split::Train, 60000, 6000},
                               Expected{tandem::data::Split::Test, 10000, 1000}}) {
    auto start = std::chrono::steady_clock::now();
    tandem::data::FashionMnist data(tandem::data::FashionMnistOptions().split(expected.split));
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[   INFO   ] Fashion-MNIST %s split (%lld images) loaded in %.3f s\n",
                expected.split == tandem::data::Split::Train ? "training" : "test",
                static_cast<long long>(expected.size), seconds);
    EXPECT_EQ(data.size().value(), static_cast<size_t>(expected.size));
    EXPECT_EQ(data.images().sizes(), at::IntArrayRef({expected.size, 1, 28, 28}));
    EXPECT_EQ(data.targets().sizes(), at::IntArrayRef({expected.size}));
    EXPECT_EQ(data.targets().scalar_type(), at::kLong);
    at::Tensor counts = at::bincount(data.targets());
    EXPECT_TRUE(at::equal(counts, at::full({10}, expected.per_class, at::kLong))) << counts;
    // Pixels 0..255 normalised: the extremes are exactly the images' minimum and maximum.
    EXPECT_EQ(data.images().min().item<float>(), normalised(0));
    EXPECT_EQ(data.images().max().item<float>(), normalised(255));
    if (expected.split == tandem::data::Split::Train) {
      // The constants are the training set's: mean 0 and std 1 after normalisation (Python/numpy:
      // mean 0.000115, std 1.000069 in float64).
      EXPECT_NEAR(data.images().mean().item<double>(), 0.000115, 1e-5);
      EXPECT_NEAR(data.images().std().item<double>(), 1.000069, 1e-5);
    } else {
      EXPECT_EQ(data.get(0).target.item<int64_t>(), 9);  // the first test label, as Python read it
      at::Tensor first = data.get(0).data.mul(tandem::data::kFashionMnistStd).add(tandem::data::kFashionMnistMean);
      EXPECT_NEAR(first.sum().item<double>() * 255.0, 33456.0, 1e-2);  // its byte sum, as Python read it
    }
  }
}
