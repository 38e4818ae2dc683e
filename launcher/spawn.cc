// fork/exec of workers. Between fork and exec only async-signal-safe calls are
// made: kolorun already runs the store server's thread.
#include "spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <system_error>

namespace kolo::launcher {
namespace {

struct Pipe {
  int read_fd = -1;
  int write_fd = -1;
};

Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  return {fds[0], fds[1]};
}

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Child side: never returns. Reports an exec failure's errno on `error_fd`.
[[noreturn]] void run_child(const SpawnRequest& request, char* const* argv, char* const* envp,
                            pid_t parent, const Pipe& out, const Pipe& err, const Pipe& in,
                            int error_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // kolorun may have died between fork and prctl; then nobody would kill us.
  if (getppid() != parent) _exit(127);

  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGQUIT, SIGXFSZ})
    signal(sig, SIG_DFL);

  int stdin_fd = request.stdin_pipe ? in.read_fd : open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd < 0 || dup2(stdin_fd, 0) < 0 || dup2(out.write_fd, 1) < 0 ||
      dup2(err.write_fd, 2) < 0) {
    int code = errno;
    (void)!write(error_fd, &code, sizeof(code));
    _exit(127);
  }
  // Every kolorun descriptor except 0-2 and the error pipe is close-on-exec or
  // closed here (e.g. store sockets opened without O_CLOEXEC).
#ifdef SYS_close_range
  if (error_fd > 3) syscall(SYS_close_range, 3u, static_cast<unsigned>(error_fd - 1), 0u);
  if (syscall(SYS_close_range, static_cast<unsigned>(error_fd + 1), ~0u, 0u) != 0)
#endif
  {
    for (int fd = 3; fd < 4096; ++fd) {
      if (fd != error_fd) close(fd);
    }
  }
  execve(request.path.c_str(), argv, envp);
  int code = errno;
  (void)!write(error_fd, &code, sizeof(code));
  _exit(127);
}

}  // namespace

SpawnedProcess spawn_process(const SpawnRequest& request) {
  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (const auto& arg : request.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& entry : request.env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe in;
  if (request.stdin_pipe) in = make_pipe();
  Pipe error = make_pipe();
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int code = errno;
    for (int* fd : {&out.read_fd, &out.write_fd, &err.read_fd, &err.write_fd, &in.read_fd,
                    &in.write_fd, &error.read_fd, &error.write_fd}) {
      close_fd(*fd);
    }
    throw std::system_error(code, std::generic_category(), "fork");
  }
  if (pid == 0) run_child(request, argv.data(), envp.data(), parent, out, err, in, error.write_fd);

  setpgid(pid, pid);  // also here, so the group exists before we signal it
  close_fd(out.write_fd);
  close_fd(err.write_fd);
  close_fd(in.read_fd);
  close_fd(error.write_fd);

  int child_errno = 0;
  ssize_t got;
  do {
    got = read(error.read_fd, &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  close_fd(error.read_fd);
  if (got > 0) {
    waitpid(pid, nullptr, 0);
    close_fd(out.read_fd);
    close_fd(err.read_fd);
    close_fd(in.write_fd);
    throw std::system_error(child_errno, std::generic_category(), "execve " + request.path);
  }

  if (!request.stdin_data.empty()) {
    // The pipe is empty and its buffer far larger: one write, never blocking.
    ssize_t written;
    do {
      written = write(in.write_fd, request.stdin_data.data(), request.stdin_data.size());
    } while (written < 0 && errno == EINTR);
    if (written != static_cast<ssize_t>(request.stdin_data.size())) {
      const int code = written < 0 ? errno : EIO;
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      close_fd(out.read_fd);
      close_fd(err.read_fd);
      close_fd(in.write_fd);
      throw std::system_error(code, std::generic_category(),
                              "writing to the stdin of " + request.path);
    }
  }
  for (int fd : {out.read_fd, err.read_fd}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (in.write_fd >= 0) fcntl(in.write_fd, F_SETFL, fcntl(in.write_fd, F_GETFL) | O_NONBLOCK);
  return {pid, out.read_fd, err.read_fd, in.write_fd};
}

CapturedRun run_captured(const SpawnRequest& request, std::chrono::milliseconds timeout) {
  SpawnedProcess p = spawn_process(request);
  CapturedRun run;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (p.stdout_fd >= 0 || p.stderr_fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      run.timed_out = true;
      break;
    }
    pollfd fds[2] = {{p.stdout_fd, POLLIN, 0}, {p.stderr_fd, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int k = 0; k < 2; ++k) {
      int& fd = k == 0 ? p.stdout_fd : p.stderr_fd;
      if (fd < 0 || fds[k].revents == 0) continue;
      char buffer[4096];
      ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        (k == 0 ? run.out : run.err).append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(fd);
        fd = -1;
      }
    }
  }
  for (int fd : {p.stdout_fd, p.stderr_fd, p.stdin_fd}) {
    if (fd >= 0) close(fd);
  }
  if (run.timed_out) kill(-p.pid, SIGKILL);
  while (waitpid(p.pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  return run;
}

std::string find_executable(const std::string& program, const std::string& path_variable) {
  auto executable = [](const std::string& path) {
    struct stat info;
    return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
           access(path.c_str(), X_OK) == 0;
  };
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return executable(program) ? program : "";
  size_t start = 0;
  while (start <= path_variable.size()) {
    size_t colon = path_variable.find(':', start);
    std::string dir =
        path_variable.substr(start, colon == std::string::npos ? colon : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + program;
    if (executable(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

std::string why_not_executable(const std::string& program) {
  if (program.find('/') == std::string::npos) {
    return "is not an executable file in PATH: check the name or give its path (e.g. ./" + program +
           ")";
  }
  struct stat info;
  if (stat(program.c_str(), &info) != 0) {
    const int error = errno;
    switch (error) {
      case ENOENT:
        return "does not exist: check the path";
      case ELOOP:
        return "is a loop of symbolic links (" + std::string(strerror(error)) +
               "): point the link at the program itself";
      case ENOTDIR:
        return "does not exist: a component of its path is not a directory";
      case EACCES:
        return "cannot be reached: permission denied on a directory of its path";
      default:
        return "cannot be examined (" + std::string(strerror(error)) + "): check the path";
    }
  }
  if (S_ISDIR(info.st_mode)) return "is a directory: give the program inside it";
  if (!S_ISREG(info.st_mode)) return "is not a regular file: give the program's path";
  return "is not an executable file: chmod +x it";
}

std::string signal_name(int signal_number) {
  const char* abbrev = sigabbrev_np(signal_number);
  if (abbrev == nullptr) return "signal " + std::to_string(signal_number);
  return std::string("SIG") + abbrev;
}

bool reap_group_leader(pid_t pid, bool kill_group, int* status) {
  if (kill_group) kill(-pid, SIGKILL);
  pid_t got;
  do {
    got = waitpid(pid, status, 0);
  } while (got < 0 && errno == EINTR);
  return got == pid;
}

long host_process_limit() {
  long limit = 0;
  const auto lower = [&limit](long value) {
    if (value > 0 && (limit == 0 || value < limit)) limit = value;
  };
  for (const char* file : {"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"}) {
    long value = 0;
    if (std::ifstream(file) >> value) lower(value);
  }
  rlimit nproc{};
  if (getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    lower(static_cast<long>(nproc.rlim_cur));
  }
  return limit;
}

}  // namespace kolo::launcher
