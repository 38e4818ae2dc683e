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
// Only regular files are read, and each header's counts are checked against
// what the file really holds before anything is allocated for them.
Split load_split(const std::string& dir, const std::string& prefix);
// The samples of a split, from its labels file alone (checked as load_split does).
int64_t split_size(const std::string& dir, const std::string& prefix);

// The parsers behind load_split, on a file's decompressed bytes; `path`
// names it in errors. (N, 1, 28, 28) uint8 images and (N) int64 labels.
torch::Tensor decode_images(const std::string& bytes, const std::string& path);
torch::Tensor decode_labels(const std::string& bytes, const std::string& path);

// The class names, by label.
const char* class_name(int64_t label);

}  // namespace fashion_mnist
