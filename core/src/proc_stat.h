// A process's state and parent from /proc/<pid>/stat, for the launcher's and
// the tests' scans of /proc. The process may exit at any moment of a scan:
// then the file is missing or its read fails with ESRCH, and the answer is
// "unknown" (nullopt), never an exception (std::ifstream's filebuf throws
// std::ios_base::failure when a read fails, which once ended kolorun with
// "basic_filebuf::underflow error reading the file: No such process").
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace kolo::detail {

struct ProcStat {
  char state = '?';  // R, S, D, Z, T, ... (proc(5))
  pid_t ppid = -1;
};

// nullopt when /proc/<pid>/stat cannot be read (the process is gone, or
// the file is not what proc(5) says).
inline std::optional<ProcStat> read_proc_stat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[1024];  // "pid (comm) state ppid ...": comm is at most 64 bytes
  const ssize_t n = ::read(fd, buffer, sizeof(buffer) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  const std::string text(buffer, static_cast<size_t>(n));
  // comm may contain spaces and parentheses: the last ')' ends it.
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 4 > text.size()) return std::nullopt;
  ProcStat stat;
  stat.state = text[paren + 2];
  char* end = nullptr;
  const long ppid = std::strtol(text.c_str() + paren + 4, &end, 10);
  if (end == text.c_str() + paren + 4) return std::nullopt;
  stat.ppid = static_cast<pid_t>(ppid);
  return stat;
}

}  // namespace kolo::detail
