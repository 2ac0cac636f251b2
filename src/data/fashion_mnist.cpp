#include "tandem/data/fashion_mnist.h"

#include <sys/stat.h>

#include <ATen/ATen.h>

#include "tandem/data/idx.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;

std::string shape_text(const at::Tensor& t) {
  std::string text;
  for (int64_t i = 0; i < t.dim(); ++i) text += (i ? " x " : "") + std::to_string(t.size(i));
  return text;
}

// read_idx names the file in its own errors; a missing dataset gets the way to install it.
at::Tensor read_part(const std::string& path) {
  struct stat info {};
  TANDEM_CHECK(::stat(path.c_str(), &info) == 0, "Fashion-MNIST: ", path,
               " not found (install the dataset: apt-get install dataset-fashion-mnist, or scripts/setup; "
               "or set FashionMnistOptions::root to a folder with the four IDX files)");
  return read_idx(path);
}

}  // namespace

FashionMnist::FashionMnist(FashionMnistOptions options) : options_(std::move(options)) {
  const std::string prefix = options_.root() + "/" + (options_.split() == Split::Train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  at::Tensor images = read_part(images_path);
  at::Tensor labels = read_part(labels_path);

  TANDEM_CHECK(images.scalar_type() == at::kByte, "Fashion-MNIST: ", images_path, " holds elements of type ",
               images.scalar_type(), " (expected unsigned bytes, IDX type 0x08)");
  TANDEM_CHECK(images.dim() == 3 && images.size(1) == kSide && images.size(2) == kSide, "Fashion-MNIST: ",
               images_path, " holds an array of ", shape_text(images), " (expected N x 28 x 28 images)");
  TANDEM_CHECK(labels.scalar_type() == at::kByte, "Fashion-MNIST: ", labels_path, " holds elements of type ",
               labels.scalar_type(), " (expected unsigned bytes, IDX type 0x08)");
  TANDEM_CHECK(labels.dim() == 1, "Fashion-MNIST: ", labels_path, " holds an array of ", shape_text(labels),
               " (expected one dimension: N labels)");
  TANDEM_CHECK(labels.size(0) == images.size(0), "Fashion-MNIST: ", labels_path, " holds ", labels.size(0),
               " labels but ", images_path, " holds ", images.size(0), " images (expected one label per image)");
  const uint8_t* label = labels.data_ptr<uint8_t>();
  for (int64_t i = 0; i < labels.size(0); ++i) {
    TANDEM_CHECK(label[i] < kClasses, "Fashion-MNIST: ", labels_path, " holds the label ", int{label[i]},
                 " at index ", i, " (expected 0 to 9)");
  }
  targets_ = labels.to(at::kLong);
  // One pass through a table of the 256 byte values, each computed in double and rounded once:
  // (byte / 255 - mean) / std.
  float table[256];
  for (int b = 0; b < 256; ++b) {
    table[b] = static_cast<float>((b / 255.0 - kFashionMnistMean) / kFashionMnistStd);
  }
  images_ = at::empty({images.size(0), 1, kSide, kSide}, at::kFloat);
  const uint8_t* pixel = images.data_ptr<uint8_t>();
  float* out = images_.data_ptr<float>();
  for (int64_t i = 0, n = images.numel(); i < n; ++i) out[i] = table[pixel[i]];
}

torch::data::Example<> FashionMnist::get(size_t index) {
  const auto n = static_cast<size_t>(images_.size(0));
  TANDEM_CHECK(index < n, "Fashion-MNIST: index ", index, " is out of range (the ",
               options_.split() == Split::Train ? "training" : "test", " split has ", n, " examples)");
  const auto i = static_cast<int64_t>(index);
  return {images_[i], targets_[i]};
}

std::optional<size_t> FashionMnist::size() const { return static_cast<size_t>(images_.size(0)); }

}  // namespace tandem::data
