// IDX reader for Fashion-MNIST (http://yann.lecun.com/exdb/mnist/ describes
// the format): a big-endian header (magic 0x00000803 for images with three
// dimensions, 0x00000801 for labels with one), then the bytes, all gzipped.
#include "fashion_mnist_data.h"

#include <zlib.h>

#include <array>
#include <memory>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {

namespace {

constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr int64_t kClasses = 10;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("Fashion-MNIST file " + path + ": " + what +
                           " (the files come from Debian's package dataset-fashion-mnist: "
                           "apt-get install dataset-fashion-mnist, or pass --data-dir)");
}

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile open(const std::string& path) {
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) fail(path, "cannot be opened (missing or unreadable)");
  return file;
}

// Reads exactly `bytes` bytes; anything short is an error naming `what`.
void read_exactly(gzFile_s* file, const std::string& path, void* out, int64_t bytes,
                  const std::string& what) {
  auto* dst = static_cast<char*>(out);
  while (bytes > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(bytes, 1 << 30));
    const int got = gzread(file, dst, chunk);
    if (got < 0) {
      int code = 0;
      fail(path, std::string("is corrupt (zlib: ") + gzerror(file, &code) + ")");
    }
    if (got == 0) fail(path, "is truncated: it ends inside the " + what);
    dst += got;
    bytes -= got;
  }
}

uint32_t big_endian(const std::array<unsigned char, 4>& b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

uint32_t read_u32(gzFile_s* file, const std::string& path, const std::string& what) {
  std::array<unsigned char, 4> bytes{};
  read_exactly(file, path, bytes.data(), 4, what);
  return big_endian(bytes);
}

void expect_end(gzFile_s* file, const std::string& path) {
  char extra = 0;
  if (gzread(file, &extra, 1) != 0) fail(path, "has bytes after the data its header announces");
}

torch::Tensor read_images(const std::string& path) {
  GzFile file = open(path);
  const uint32_t magic = read_u32(file.get(), path, "header");
  if (magic != 0x00000803) {
    fail(path, "is not an IDX image file (magic " + std::to_string(magic) + ", expected 2051)");
  }
  const int64_t count = read_u32(file.get(), path, "header");
  const int64_t rows = read_u32(file.get(), path, "header");
  const int64_t cols = read_u32(file.get(), path, "header");
  if (rows != kRows || cols != kCols) {
    fail(path,
         "holds " + std::to_string(rows) + "x" + std::to_string(cols) + " images, expected 28x28");
  }
  torch::Tensor images = torch::empty({count, 1, rows, cols}, torch::kUInt8);
  read_exactly(file.get(), path, images.data_ptr<uint8_t>(), images.numel(), "pixels");
  expect_end(file.get(), path);
  return images;
}

torch::Tensor read_labels(const std::string& path) {
  GzFile file = open(path);
  const uint32_t magic = read_u32(file.get(), path, "header");
  if (magic != 0x00000801) {
    fail(path, "is not an IDX label file (magic " + std::to_string(magic) + ", expected 2049)");
  }
  const int64_t count = read_u32(file.get(), path, "header");
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  read_exactly(file.get(), path, bytes.data(), count, "labels");
  expect_end(file.get(), path);
  torch::Tensor labels = torch::empty({count}, torch::kLong);
  int64_t* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    if (bytes[i] >= kClasses) {
      fail(path, "holds label " + std::to_string(bytes[i]) + " at index " + std::to_string(i) +
                     ", expected 0..9");
    }
    out[i] = bytes[i];
  }
  return labels;
}

}  // namespace

Split load_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  Split split{read_images(images_path), read_labels(labels_path)};
  if (split.images.size(0) != split.labels.size(0)) {
    fail(labels_path, "holds " + std::to_string(split.labels.size(0)) + " labels but " +
                          images_path + " holds " + std::to_string(split.images.size(0)) +
                          " images");
  }
  return split;
}

const char* class_name(int64_t label) {
  static constexpr std::array<const char*, kClasses> kNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < kClasses ? kNames[label] : "?";
}

}  // namespace fashion_mnist
