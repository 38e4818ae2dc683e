// File store: one file per key in a directory shared by the ranks.
//
// A key is escaped into a file name ("k." + [A-Za-z0-9_-] kept, every other byte
// as %XX). Values are checked files (kStoreValueFile, kolo/core/checked_file.h)
// written to a temporary file and renamed over the key's file, so readers see
// either the old or the new value, never a partial one, and a damaged one is
// an error naming the file.
// Mutations (set, add, erase) hold an flock on "<dir>/lock" so that add() is an
// atomic read-modify-write across processes and threads (each call opens the
// lock file anew, and flock locks belong to the open file description).
// get()/wait() poll the directory with a short sleep until their timeout.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "kolo/core/checked_file.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;

// File names longer than this are refused (NAME_MAX is 255 on Linux).
constexpr size_t kMaxFileNameBytes = 240;
// Poll interval of get()/wait(): short enough for rendezvous latency, long
// enough not to burn a core that a peer needs.
constexpr std::chrono::milliseconds kPollInterval{2};

std::string errno_text() { return std::strerror(errno); }

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

class FileStore : public Store {
 public:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {
    make_directories();
  }

  void set(const std::string& key, const Bytes& value) override {
    std::string path = path_of(key);
    Lock lock(*this);
    write_atomically(path, value);
  }

  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string path = path_of(key);
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto value = read_file(path)) return *value;
      if (Clock::now() >= deadline) {
        throw TimeoutError("kolo file store " + directory_ + ": get timed out after " +
                           std::to_string(timeout.count()) + " ms waiting for key '" + key +
                           "'; the rank that should set it has not arrived (is it running?)");
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    std::string path = path_of(key);
    Lock lock(*this);
    int64_t value = 0;
    if (auto old = read_file(path)) {
      std::string text(old->begin(), old->end());
      char* end = nullptr;
      errno = 0;
      long long parsed = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno != 0) {
        throw ContractError("kolo file store " + directory_ + ": add: the existing value of '" +
                            key + "' is not a decimal integer");
      }
      value = parsed;
    }
    value += delta;
    std::string text = std::to_string(value);
    write_atomically(path, Bytes(text.begin(), text.end()));
    return value;
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) {
      if (access(path_of(key).c_str(), F_OK) != 0) return false;
    }
    return true;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> paths;
    for (const auto& key : keys) paths.push_back(path_of(key));
    auto deadline = Clock::now() + timeout;
    for (;;) {
      std::string missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (access(paths[i].c_str(), F_OK) != 0) {
          missing += (missing.empty() ? "'" : ", '") + keys[i] + "'";
        }
      }
      if (missing.empty()) return;
      if (Clock::now() >= deadline) {
        throw TimeoutError("kolo file store " + directory_ + ": wait timed out after " +
                           std::to_string(timeout.count()) + " ms; missing keys: " + missing);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  bool erase(const std::string& key) override {
    std::string path = path_of(key);
    Lock lock(*this);
    if (unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw RuntimeFault("kolo file store: cannot remove " + path + ": " + errno_text());
  }

 private:
  // Exclusive flock on <dir>/lock for the lifetime of the object.
  class Lock {
   public:
    explicit Lock(const FileStore& store) {
      std::string path = store.directory_ + "/lock";
      fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) throw RuntimeFault("kolo file store: cannot open " + path + ": " + errno_text());
      while (flock(fd_, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        std::string reason = errno_text();
        close(fd_);
        throw RuntimeFault("kolo file store: cannot lock " + path + ": " + reason);
      }
    }
    ~Lock() { close(fd_); }  // closing releases the flock
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    int fd_ = -1;
  };

  void make_directories() const {
    if (directory_.empty()) {
      throw ContractError("kolo make_file_store: empty directory; give a path shared by the ranks");
    }
    // mkdir -p: create each prefix in turn; existing ones are fine.
    for (size_t slash = 0;;) {
      slash = directory_.find('/', slash + 1);
      std::string prefix = directory_.substr(0, slash);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        throw RuntimeFault("kolo make_file_store: cannot create directory " + prefix + ": " +
                           errno_text());
      }
      if (slash == std::string::npos) break;
    }
    struct stat info {};
    if (stat(directory_.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      throw ContractError("kolo make_file_store: " + directory_ + " is not a directory");
    }
  }

  std::string path_of(const std::string& key) const {
    static const char kHex[] = "0123456789ABCDEF";
    std::string name = "k.";
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '_' || c == '-') {
        name += static_cast<char>(c);
      } else {
        name += '%';
        name += kHex[c >> 4];
        name += kHex[c & 15];
      }
    }
    if (name.size() > kMaxFileNameBytes) {
      throw ContractError("kolo file store: key '" + key.substr(0, 64) + "...' escapes to a " +
                          std::to_string(name.size()) + "-byte file name, over the limit of " +
                          std::to_string(kMaxFileNameBytes) + "; use shorter keys");
    }
    return directory_ + "/" + name;
  }

  // The file's contents, or nullopt when it does not exist.
  std::optional<Bytes> read_file(const std::string& path) const {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      throw RuntimeFault("kolo file store: cannot open " + path + ": " + errno_text());
    }
    FdCloser closer(fd);
    std::string bytes;
    char buffer[65536];
    for (;;) {
      ssize_t got = read(fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw RuntimeFault("kolo file store: cannot read " + path + ": " + errno_text());
      if (got == 0) break;
      bytes.append(buffer, static_cast<size_t>(got));
    }
    const std::string value = decode_checked(kStoreValueFile, bytes, path);
    return Bytes(value.begin(), value.end());
  }

  // A checked file written to a temporary name and renamed over `path`; not
  // fsynced (the store lives as long as the job).
  void write_atomically(const std::string& path, const Bytes& value) {
    CheckedWriteOptions options;
    options.durable = false;
    try {
      write_checked_file(path, kStoreValueFile, std::string(value.begin(), value.end()), options);
    } catch (const ContractError& e) {
      throw RuntimeFault(e.what());
    }
  }

  const std::string directory_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace kolo
