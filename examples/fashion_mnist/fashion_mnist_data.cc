// IDX reader for Fashion-MNIST (http://yann.lecun.com/exdb/mnist/ describes
// the format): a big-endian header (magic 0x00000803 for images with three
// dimensions, 0x00000801 for labels with one), then the bytes, all gzipped.
#include "fashion_mnist_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

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

// The whole decompressed contents of `path`. Only a regular file is read: a
// FIFO or a device could block or never end. Nothing is allocated from the
// header's claims: the buffer grows with what the file really holds, and the
// header is checked against that.
std::string read_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, std::string("cannot be opened (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "is not a regular file (a FIFO, device or directory); give the gzipped IDX file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  GzFile file(gzdopen(fd, "rb"));
  if (!file) {
    ::close(fd);
    fail(path, "cannot be opened (out of memory)");
  }
  std::string bytes;
  std::array<char, 1 << 16> chunk{};
  for (;;) {
    const int got = gzread(file.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got < 0) {
      int code = 0;
      fail(path, std::string("is truncated or corrupt (zlib: ") + gzerror(file.get(), &code) + ")");
    }
    if (got == 0) break;
    bytes.append(chunk.data(), static_cast<size_t>(got));
  }
  return bytes;
}

uint32_t read_u32(const std::string& bytes, size_t offset) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

// That the file holds exactly `header` bytes of header and `count` items of
// `item_bytes` each, as its header announces.
void check_size(const std::string& path, const std::string& bytes, size_t header, int64_t count,
                int64_t item_bytes, const std::string& items) {
  const uint64_t announced = static_cast<uint64_t>(count) * static_cast<uint64_t>(item_bytes);
  const uint64_t held = bytes.size() - header;
  if (announced != held) {
    fail(path, std::string(held < announced ? "is truncated" : "has bytes after its data") +
                   ": the header announces " + std::to_string(count) + " " + items + " (" +
                   std::to_string(announced) + " bytes), the file holds " + std::to_string(held));
  }
}

}  // namespace

torch::Tensor decode_images(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 16) fail(path, "is truncated: it ends inside the header");
  const uint32_t magic = read_u32(bytes, 0);
  if (magic != 0x00000803) {
    fail(path, "is not an IDX image file (magic " + std::to_string(magic) + ", expected 2051)");
  }
  const int64_t count = read_u32(bytes, 4);
  const int64_t rows = read_u32(bytes, 8);
  const int64_t cols = read_u32(bytes, 12);
  if (rows != kRows || cols != kCols) {
    fail(path,
         "holds " + std::to_string(rows) + "x" + std::to_string(cols) + " images, expected 28x28");
  }
  check_size(path, bytes, 16, count, rows * cols, "images");
  torch::Tensor images = torch::empty({count, 1, rows, cols}, torch::kUInt8);
  std::memcpy(images.data_ptr<uint8_t>(), bytes.data() + 16, static_cast<size_t>(images.numel()));
  return images;
}

torch::Tensor decode_labels(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8) fail(path, "is truncated: it ends inside the header");
  const uint32_t magic = read_u32(bytes, 0);
  if (magic != 0x00000801) {
    fail(path, "is not an IDX label file (magic " + std::to_string(magic) + ", expected 2049)");
  }
  const int64_t count = read_u32(bytes, 4);
  check_size(path, bytes, 8, count, 1, "labels");
  torch::Tensor labels = torch::empty({count}, torch::kLong);
  int64_t* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<unsigned char>(bytes[8 + i]);
    if (label >= kClasses) {
      fail(path, "holds label " + std::to_string(label) + " at index " + std::to_string(i) +
                     ", expected 0..9");
    }
    out[i] = label;
  }
  return labels;
}

Split load_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  Split split{decode_images(read_file(images_path), images_path),
              decode_labels(read_file(labels_path), labels_path)};
  if (split.images.size(0) != split.labels.size(0)) {
    fail(labels_path, "holds " + std::to_string(split.labels.size(0)) + " labels but " +
                          images_path + " holds " + std::to_string(split.images.size(0)) +
                          " images");
  }
  return split;
}

int64_t split_size(const std::string& dir, const std::string& prefix) {
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  return decode_labels(read_file(labels_path), labels_path).size(0);
}

const char* class_name(int64_t label) {
  static constexpr std::array<const char*, kClasses> kNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < kClasses ? kNames[label] : "?";
}

}  // namespace fashion_mnist
