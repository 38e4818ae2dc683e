// Starting one worker process (fork + exec) with its output on pipes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace kolo::launcher {

struct SpawnRequest {
  std::string path;               // executable to run (already resolved)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // complete environment, "NAME=VALUE"
  // Keep a pipe to the child's stdin (remote workers: closing it stops them);
  // otherwise the child's stdin is /dev/null.
  bool stdin_pipe = false;
  // With stdin_pipe: bytes written to the pipe before spawn_process returns
  // (a remote worker's job secret, which must not appear on a command line).
  // At most a pipe buffer (4 KiB here is far below the 64 KiB of Linux), so
  // the write never blocks.
  std::string stdin_data;
};

struct SpawnedProcess {
  pid_t pid = -1;      // also the id of its own process group
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec
  int stderr_fd = -1;
  int stdin_fd = -1;  // write end when stdin_pipe, else -1
};

// Forks and execs. The child runs in a new process group (kolorun signals the
// whole group, so the worker's own children go too), asks the kernel to SIGKILL
// it when kolorun dies (PR_SET_PDEATHSIG), and starts with default signal
// dispositions and an empty signal mask. Throws std::system_error when fork or
// exec fails (an exec failure is reported back through a close-on-exec pipe).
// Call it from the main thread: the parent-death signal fires when the thread
// that forked exits.
SpawnedProcess spawn_process(const SpawnRequest& request);

// A short-lived command's outcome (run_captured).
struct CapturedRun {
  int status = 0;          // waitpid status
  bool timed_out = false;  // killed (its whole group) at the timeout
  std::string out;         // everything it wrote on stdout
  std::string err;         // and on stderr
};

// Runs `request` to completion, collecting its output; at `timeout` its
// process group is SIGKILLed. Reaps only its own process. Throws
// std::system_error when it cannot be started.
CapturedRun run_captured(const SpawnRequest& request, std::chrono::milliseconds timeout);

// Resolves a program name as execvp would (a name with '/' is used as is; others
// are searched in PATH). Returns the path, or "" when no executable file exists.
std::string find_executable(const std::string& program, const std::string& path_variable);

// Why find_executable(program, PATH) found nothing, as a phrase that
// follows the program's name in a message: "is not an executable file in
// PATH: ...", "does not exist: ...", "is a loop of symbolic links: ...",
// "is a directory: ...", "is not executable: chmod +x it". Each ends with
// what to do about it.
std::string why_not_executable(const std::string& program);

// The most processes this host lets kolorun's user run at once: the least of
// kernel.pid_max, kernel.threads-max and the soft RLIMIT_NPROC (ulimit -u);
// 0 when none of them can be read. Every local worker is at least one.
long host_process_limit();

// Reaps the exited group leader `pid` (waitpid, retried on EINTR). With
// `kill_group`, first SIGKILLs what it left in its process group: while the
// leader is an unreaped zombie its group id cannot be reused, so the group is
// still addressable. Returns true, with the wait status in *status, when `pid`
// was reaped.
bool reap_group_leader(pid_t pid, bool kill_group, int* status);

// The name of a signal ("SIGKILL"), or "signal N" when unknown.
std::string signal_name(int signal_number);

}  // namespace kolo::launcher
