// Fashion-MNIST as Debian installs it (package dataset-fashion-mnist): four
// gzipped IDX files in /usr/share/datasets/fashion-mnist.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace fashion_mnist {

constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

struct Split {
  torch::Tensor images;  // (N, 1, 28, 28) uint8, 0 = background
  torch::Tensor labels;  // (N) int64 in [0, 10)
};

// Reads "<dir>/<prefix>-images-idx3-ubyte.gz" and "<dir>/<prefix>-labels-idx1-ubyte.gz"
// (prefix "train" or "t10k"). A missing, truncated or malformed file is a
// std::runtime_error naming the file and the Debian package that provides it.
Split load_split(const std::string& dir, const std::string& prefix);

// The class names, by label.
const char* class_name(int64_t label);

}  // namespace fashion_mnist
