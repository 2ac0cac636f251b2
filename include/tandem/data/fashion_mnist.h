#pragma once
// FashionMnist: Zalando's Fashion-MNIST (70000 28x28 grey images of clothes, 10 classes) as a
// LibTorch dataset, read from Debian's `dataset-fashion-mnist` package (the four gzip IDX files
// under /usr/share/datasets/fashion-mnist/) with read_idx — no download, no Python.
//
// Images are float [1, 28, 28]: the bytes scaled to [0, 1], then normalised with the training
// set's mean and standard deviation (kFashionMnistMean, kFashionMnistStd). Targets are int64
// class indices 0..9 (0 T-shirt/top, 1 trouser, 2 pullover, 3 dress, 4 coat, 5 sandal, 6 shirt,
// 7 sneaker, 8 bag, 9 ankle boot). The whole split is decoded once, in the constructor:
// get() is an index into images() and targets().
//
// Example:
//   tandem::data::FashionMnist test(tandem::data::FashionMnistOptions().split(tandem::data::Split::Test));
//   auto example = test.get(0);                   // data [1, 28, 28] float, target int64 scalar
//   at::Tensor x = test.images();                  // [10000, 1, 28, 28], for plain-tensor pipelines
//   auto loader = torch::data::make_data_loader(
//       tandem::data::FashionMnist().map(torch::data::transforms::Stack<>()), 64);
#include <cstddef>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

namespace tandem::data {

/// Where Debian's dataset-fashion-mnist package installs the four gzip IDX files.
constexpr const char* kFashionMnistRoot = "/usr/share/datasets/fashion-mnist";
/// Mean of the 60000 training images' pixels scaled to [0, 1] (0.28604 to five places).
constexpr double kFashionMnistMean = 0.2860;
/// Standard deviation of the same pixels (0.35302 to five places).
constexpr double kFashionMnistStd = 0.3530;

/// Which part of a dataset: Fashion-MNIST has 60000 training and 10000 test examples.
enum class Split { Train, Test };

/// Options of FashionMnist.
///
/// Example:
///   auto options = tandem::data::FashionMnistOptions()
///                      .root("/usr/share/datasets/fashion-mnist")
///                      .split(tandem::data::Split::Test);
struct FashionMnistOptions {
  /// Folder with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz
  /// and t10k-labels-idx1-ubyte.gz (gzip or plain IDX content; the names are fixed).
  TORCH_ARG(std::string, root) = kFashionMnistRoot;
  /// Train (60000 examples, the train-* files) or Test (10000, the t10k-* files).
  TORCH_ARG(Split, split) = Split::Train;
};

class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  /// Reads and checks the split's two files; throws tandem::Error (one line, naming the file)
  /// when one is missing, malformed, or not Fashion-MNIST-shaped.
  explicit FashionMnist(FashionMnistOptions options = {});

  /// Example `index`: data [1, 28, 28] float (normalised), target an int64 scalar.
  torch::data::Example<> get(size_t index) override;
  std::optional<size_t> size() const override;

  /// Every image: [N, 1, 28, 28] float, normalised.
  const at::Tensor& images() const { return images_; }
  /// Every class index: [N] int64.
  const at::Tensor& targets() const { return targets_; }
  const FashionMnistOptions& options() const { return options_; }

 private:
  FashionMnistOptions options_;
  at::Tensor images_;
  at::Tensor targets_;
};

}  // namespace tandem::data
