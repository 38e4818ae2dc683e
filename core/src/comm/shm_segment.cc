// POSIX shared-memory segments, futex waits and process liveness (shm_segment.h).
#include "comm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

std::string system_error(const std::string& what, const std::string& name, int error) {
  return "kolo shm: " + what + " '" + name + "' failed: " + std::strerror(error);
}

// Maps an open descriptor and closes it (the mapping keeps the object alive).
void* map_descriptor(int fd, size_t bytes, const std::string& name) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (data == MAP_FAILED) throw RuntimeFault(system_error("mmap of", name, error));
  return data;
}

// Fields of /proc/<pid>/stat after the command name, which may contain spaces
// and parentheses: field 3 (state) is returned first.
bool read_stat_fields(pid_t pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::ifstream file(path);
  if (!file) return false;
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return false;
  std::istringstream fields(text.substr(close_paren + 1));
  std::string field;
  // Fields 3..22: state is 3, starttime is 22.
  for (int index = 3; index <= 22; ++index) {
    if (!(fields >> field)) return false;
    if (index == 3) *state = field.empty() ? '?' : field[0];
    if (index == 22) *start_time = std::strtoull(field.c_str(), nullptr, 10);
  }
  return true;
}

// Names this process created and has not unlinked yet, unlinked at exit().
struct LinkedNames {
  std::mutex mutex;
  std::set<std::string> names;
  bool handler_registered = false;
};

LinkedNames& linked_names() {
  static LinkedNames* names = new LinkedNames;  // never destroyed: used by the atexit handler
  return *names;
}

void unlink_linked_names_at_exit() {
  LinkedNames& linked = linked_names();
  std::lock_guard<std::mutex> lock(linked.mutex);
  for (const auto& name : linked.names) shm_unlink(name.c_str());
  linked.names.clear();
}

void remember_linked(const std::string& name) {
  LinkedNames& linked = linked_names();
  std::lock_guard<std::mutex> lock(linked.mutex);
  linked.names.insert(name);
  if (!linked.handler_registered) {
    linked.handler_registered = true;
    std::atexit(unlink_linked_names_at_exit);
  }
}

void forget_linked(const std::string& name) {
  LinkedNames& linked = linked_names();
  std::lock_guard<std::mutex> lock(linked.mutex);
  linked.names.erase(name);
}

// Calls `visit(pid, name)` for each /dev/shm entry named by
// unique_segment_name() ("kolo-<pid>-<16 hex digits>").
template <typename Visit>
void for_each_segment(Visit&& visit) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    int pid = 0;
    unsigned long long tag = 0;
    int consumed = 0;
    if (std::sscanf(entry->d_name, "kolo-%d-%16llx%n", &pid, &tag, &consumed) != 2 ||
        entry->d_name[consumed] != '\0' || pid <= 0) {
      continue;
    }
    visit(static_cast<pid_t>(pid), std::string(entry->d_name));
  }
  closedir(dir);
}

}  // namespace

ShmSegment::~ShmSegment() { release(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

void ShmSegment::release() {
  unlink();
  if (data_ != nullptr) munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw RuntimeFault(system_error("shm_open (create) of", name, errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw RuntimeFault(
        system_error("ftruncate to " + std::to_string(bytes) + " bytes of", name, error) +
        " (is /dev/shm large enough?)");
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.linked_ = true;
  remember_linked(name);
  try {
    segment.data_ = map_descriptor(fd, bytes, name);
  } catch (...) {
    segment.unlink();
    throw;
  }
  segment.bytes_ = bytes;
  return segment;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    throw RuntimeFault(system_error("shm_open of", name, errno) +
                       " (the creating rank gave up or died, or the store prefix was reused "
                       "by an older communicator: use a fresh prefix)");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes) {
    close(fd);
    throw RuntimeFault("kolo shm: segment '" + name + "' has " + std::to_string(info.st_size) +
                       " bytes, expected " + std::to_string(bytes));
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = map_descriptor(fd, bytes, name);
  segment.bytes_ = bytes;
  return segment;
}

void ShmSegment::unlink() {
  if (linked_) {
    shm_unlink(name_.c_str());
    forget_linked(name_);
  }
  linked_ = false;
}

std::string unique_segment_name() {
  std::random_device device;
  const uint64_t high = device();
  const uint64_t low = device();
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char name[64];
  std::snprintf(name, sizeof(name), "/kolo-%d-%016llx", static_cast<int>(getpid()),
                static_cast<unsigned long long>(((high << 32) | low) ^ now));
  return name;
}

int remove_stale_segments(std::chrono::seconds min_age) {
  int removed = 0;
  const time_t now = time(nullptr);
  for_each_segment([&](pid_t pid, const std::string& name) {
    struct stat info {};
    if (stat(("/dev/shm/" + name).c_str(), &info) != 0 || now - info.st_mtime < min_age.count()) {
      return;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) return;  // creator alive (or not ours to judge)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  });
  return removed;
}

int remove_segments_of(pid_t pid) {
  int removed = 0;
  for_each_segment([&](pid_t creator, const std::string& name) {
    if (creator == pid && shm_unlink(("/" + name).c_str()) == 0) ++removed;
  });
  return removed;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word is 32 bits");
  if (timeout.count() <= 0) return;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE: waiters and wakers are in different processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &relative, nullptr,
          0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint64_t process_start_time(pid_t pid) {
  char state = '?';
  uint64_t start_time = 0;
  return read_stat_fields(pid, &state, &start_time) ? start_time : 0;
}

bool process_alive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return true;  // not registered: nothing to judge
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = '?';
  uint64_t current_start = 0;
  if (!read_stat_fields(pid, &state, &current_start)) {
    // No /proc entry (or no /proc at all): trust kill().
    return kill(pid, 0) == 0 || errno != ESRCH;
  }
  if (state == 'Z' || state == 'X') return false;
  if (start_time != 0 && current_start != 0 && current_start != start_time) return false;
  return true;
}

}  // namespace kolo::detail
