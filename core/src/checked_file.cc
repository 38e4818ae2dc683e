// The checked file container (kolo/core/checked_file.h).
#include "kolo/core/checked_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "kolo/core/errors.h"

namespace kolo {

const FileKind kCheckpointFile = {{'K', 'O', 'L', 'O', 'C', 'K', 'P', 'T'}, "kolo checkpoint"};
const FileKind kElasticCommitFile = {{'K', 'O', 'L', 'O', 'C', 'M', 'I', 'T'},
                                     "kolo elastic commit"};
const FileKind kStoreValueFile = {{'K', 'O', 'L', 'O', 'S', 'T', 'O', 'R'},
                                  "kolo file store value"};

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  // zlib takes uInt lengths: feed large buffers in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  uLong value = crc;
  while (size > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    value = ::crc32(value, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(value);
}

namespace {

constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", v);
  return text;
}

std::string magic_text(const FileKind& kind) { return std::string(kind.magic, 8); }

[[noreturn]] void fail(const FileKind& kind, const std::string& path, const std::string& what) {
  throw ContractError(std::string(kind.what) + " '" + path + "': " + what);
}

[[noreturn]] void fail_errno(const FileKind& kind, const std::string& path, const std::string& call,
                             int error) {
  fail(kind, path, call + " failed: " + std::strerror(error));
}

void write_all(int fd, const char* data, size_t size, const FileKind& kind,
               const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(kind, path, "write", errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes a descriptor on scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Temporary names unique within the process (pid + counter) and so across
// threads and processes sharing the directory.
std::atomic<uint64_t> temp_counter{0};

}  // namespace

std::string encode_checked(const FileKind& kind, const std::string& payload) {
  std::string bytes(kHeaderBytes, '\0');
  auto* header = reinterpret_cast<unsigned char*>(&bytes[0]);
  std::memcpy(header, kind.magic, 8);
  put_u32(header + 8, kVersion);
  put_u32(header + 12, static_cast<uint32_t>(kHeaderBytes));
  put_u64(header + 16, payload.size());
  put_u32(header + 24, crc32(payload.data(), payload.size()));
  put_u32(header + 28, crc32(header, 28));
  return bytes + payload;
}

std::string decode_checked(const FileKind& kind, const std::string& bytes,
                           const std::string& source) {
  const auto* h = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < kHeaderBytes) {
    fail(kind, source,
         "truncated: the file has " + std::to_string(bytes.size()) + " bytes, less than the " +
             std::to_string(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(h, kind.magic, 8) != 0) {
    fail(kind, source,
         std::string("not a ") + kind.what + " (bad magic: the file does not start with \"" +
             magic_text(kind) + "\")");
  }
  const uint32_t version = get_u32(h + 8);
  const uint32_t header_crc = get_u32(h + 28);
  if (crc32(h, 28) != header_crc) {
    fail(kind, source,
         "corrupt header (header checksum " + hex32(crc32(h, 28)) + ", stored " +
             hex32(header_crc) + ")");
  }
  if (version != kVersion) {
    fail(kind, source,
         "format version " + std::to_string(version) + " is not supported (this build reads " +
             std::to_string(kVersion) + ")");
  }
  if (get_u32(h + 12) != kHeaderBytes) {
    fail(kind, source, "unexpected header size " + std::to_string(get_u32(h + 12)));
  }
  const uint64_t payload_size = get_u64(h + 16);
  const uint64_t actual = bytes.size() - kHeaderBytes;
  if (actual < payload_size) {
    fail(kind, source,
         "truncated: the header announces a payload of " + std::to_string(payload_size) +
             " bytes, the file holds " + std::to_string(actual));
  }
  if (actual > payload_size) {
    fail(kind, source,
         "wrong size: the header announces a payload of " + std::to_string(payload_size) +
             " bytes, the file holds " + std::to_string(actual) + " (trailing bytes)");
  }
  const uint32_t stored = get_u32(h + 24);
  const uint32_t computed = crc32(bytes.data() + kHeaderBytes, payload_size);
  if (stored != computed) {
    fail(kind, source,
         "corrupt: payload checksum mismatch (stored " + hex32(stored) + ", computed " +
             hex32(computed) + ")");
  }
  return bytes.substr(kHeaderBytes);
}

namespace {
// "a directory", "a FIFO", ... for messages about a path of the wrong type.
std::string file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a device";
}
}  // namespace

void write_checked_file(const std::string& path, const FileKind& kind, const std::string& payload,
                        const CheckedWriteOptions& options) {
  if (path.empty()) fail(kind, path, "the path is empty");
  // The rename below replaces whatever `path` names. A device, FIFO or
  // socket there is not ours to replace (as root, /dev/null would become a
  // regular file for the whole machine), and a directory cannot be: refuse
  // them before anything is written. A symbolic link is followed by stat().
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    fail(kind, path,
         "exists and is not a regular file (" + file_type_name(existing.st_mode) +
             "), which writing would replace; give the path of a file (or of none yet)");
  }
  const std::string bytes = encode_checked(kind, payload);
  // In the same directory, so that the rename is atomic.
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter.fetch_add(1));
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(kind, path, "creating the temporary file '" + temp + "'", errno);
  try {
    FdGuard guard{fd};
    write_all(fd, bytes.data(), bytes.size(), kind, path);
    if (options.durable && ::fsync(fd) != 0) fail_errno(kind, path, "fsync", errno);
    guard.fd = -1;
    if (::close(fd) != 0) fail_errno(kind, path, "close", errno);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      fail_errno(kind, path, "renaming '" + temp + "' over it", errno);
    }
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  if (!options.durable) return;
  // Make the rename itself durable.
  const std::string dir = directory_of(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail_errno(kind, path, "opening its directory '" + dir + "' for fsync", errno);
  FdGuard dir_guard{dir_fd};
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    fail_errno(kind, path, "fsync of its directory '" + dir + "'", errno);
  }
}

std::string read_checked_file(const std::string& path, const FileKind& kind) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check
  // below refuses it before any read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT)
      fail(kind, path, "the file does not exist (check the path or resume flag)");
    fail_errno(kind, path, "open", errno);
  }
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(kind, path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    fail(kind, path,
         "not a regular file (" + file_type_name(st.st_mode) +
             "); give the path of a file kolo wrote");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, &bytes[done], bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(kind, path, "read", errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return decode_checked(kind, bytes, path);
}

}  // namespace kolo
