// The checked file container (kolo/core/checked_file.h): zlib's CRC-32, the
// round trip, every kind of damage rejected with the file named, kinds that
// do not mix, and paths that are not regular files refused without blocking.
#include "kolo/core/checked_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "temp_dir.h"

namespace kolo {
namespace {

using testing::TempDir;

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

// Bit-at-a-time CRC-32, the textbook definition.
uint32_t reference_crc32(const unsigned char* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

TEST(Crc32, ZlibValuesAndTheBitwiseDefinition) {
  EXPECT_EQ(crc32("", 0), 0u);
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32(fox.data(), fox.size()), 0x414FA339u);  // zlib.crc32
  // Running checksum over two pieces.
  EXPECT_EQ(crc32(fox.data() + 10, fox.size() - 10, crc32(fox.data(), 10)), 0x414FA339u);
  std::mt19937 random(1);
  std::vector<unsigned char> data(300);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t n = 0; n + offset <= data.size(); n += 13) {
      ASSERT_EQ(crc32(data.data() + offset, n), reference_crc32(data.data() + offset, n))
          << "offset " << offset << " length " << n;
    }
  }
}

TEST(CheckedFile, RoundTripOfEveryKindWithoutTemporaries) {
  TempDir dir("kolo-checked");
  std::string payload(70000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 13);
  for (const FileKind* kind : {&kCheckpointFile, &kElasticCommitFile, &kStoreValueFile}) {
    const std::string path = dir.file(std::string(kind->magic, 8));
    CheckedWriteOptions options;
    options.durable = kind == &kCheckpointFile;
    write_checked_file(path, *kind, payload, options);
    EXPECT_EQ(read_checked_file(path, *kind), payload);
    EXPECT_EQ(std::filesystem::file_size(path), payload.size() + 32);
    EXPECT_EQ(decode_checked(*kind, encode_checked(*kind, "x"), "memory"), "x");
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 3);
}

TEST(CheckedFile, KindsDoNotMixAndDamageNamesTheSource) {
  const std::string commit = encode_checked(kElasticCommitFile, "state");
  std::string message = error_of([&] { decode_checked(kCheckpointFile, commit, "run/x"); });
  EXPECT_NE(message.find("kolo checkpoint 'run/x': not a kolo checkpoint (bad magic"),
            std::string::npos)
      << message;
  std::string newer = commit;
  newer[8] = 2;  // container version 2, header checksum made to match
  const uint32_t header_crc = crc32(newer.data(), 28);
  for (int i = 0; i < 4; ++i) newer[28 + i] = static_cast<char>(header_crc >> (8 * i));
  message = error_of([&] { decode_checked(kElasticCommitFile, newer, "c"); });
  EXPECT_NE(message.find("format version 2 is not supported (this build reads 1)"),
            std::string::npos)
      << message;
}

// Issue 15: a FIFO given as a file kolo reads must not block the reader.
TEST(CheckedFile, AFifoOrADirectoryIsRefusedWithoutBlocking) {
  TempDir dir("kolo-checked");
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string message = error_of([&] { read_checked_file(fifo, kCheckpointFile); });
  EXPECT_NE(message.find("'" + fifo + "': not a regular file (a FIFO)"), std::string::npos)
      << message;
  message = error_of([&] { read_checked_file(dir.path(), kCheckpointFile); });
  EXPECT_NE(message.find("not a regular file (a directory)"), std::string::npos) << message;
}

// A device or FIFO given as a path kolo writes is refused, not replaced: the
// write renames a temporary file over its path, and as root that turned
// /dev/null into a regular file for the whole machine (stop 27).
TEST(CheckedFile, WritingOverAFifoOrADirectoryIsRefusedAndLeavesItInPlace) {
  TempDir dir("kolo-checked");
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string message = error_of([&] { write_checked_file(fifo, kCheckpointFile, "x"); });
  EXPECT_NE(message.find("kolo checkpoint '" + fifo +
                         "': exists and is not a regular file (a FIFO), which writing would "
                         "replace"),
            std::string::npos)
      << message;
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  const std::string sub = dir.file("sub");
  std::filesystem::create_directory(sub);
  message = error_of([&] { write_checked_file(sub, kElasticCommitFile, "x"); });
  EXPECT_NE(message.find("not a regular file (a directory)"), std::string::npos) << message;
  // Nothing left behind: no temporary file next to either path.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 2);
  // A regular file (and a symbolic link to one) is still replaced atomically.
  const std::string file = dir.file("file");
  write_checked_file(file, kCheckpointFile, "one");
  const std::string link = dir.file("link");
  std::filesystem::create_symlink(file, link);
  write_checked_file(link, kCheckpointFile, "two");
  EXPECT_EQ(read_checked_file(link, kCheckpointFile), "two");
}

}  // namespace
}  // namespace kolo
