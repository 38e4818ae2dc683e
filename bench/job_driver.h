// Driving a kolorun job from a benchmark (`kolo-bench elastic`, `kolo-bench
// chaos`): kolorun runs with its stdout and stderr on pipes, in a process
// group of its own; the driver reads whole lines with the time each arrived,
// finds the workers among kolorun's children, and stops the job.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace kolo::bench {

using DriverClock = std::chrono::steady_clock;

double seconds_between(DriverClock::time_point a, DriverClock::time_point b);

// kolorun and the Fashion-MNIST example: the given paths, or those of the
// build tree this program belongs to. Throws ContractError naming `mode`
// when one is not an executable.
struct JobPrograms {
  std::string kolorun;
  std::string example;
};
JobPrograms find_job_programs(const std::string& mode, const std::string& kolorun,
                              const std::string& example);

struct Job {
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr
  std::string partial[2];
};

struct Line {
  int stream;  // 0 = stdout, 1 = stderr
  std::string text;
  DriverClock::time_point at;  // when the driver read it
};

// Starts argv[0] (a path) with `env` added to this process's environment
// ("NAME=VALUE" entries). Throws RuntimeFault.
Job start_job(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// The complete lines that arrive within `wait_ms`; empty when none did. Sets
// `eof` once both pipes are closed.
std::vector<Line> read_lines(Job& job, int wait_ms, bool* eof);

// The pid of kolorun's child with KOLO_WORKER_ID=`worker_id` (-1 if none).
pid_t worker_pid(pid_t kolorun, int worker_id);

// The pids of kolorun's children (its workers).
std::vector<pid_t> children_of(pid_t parent);

// Waits for the job to exit on its own, reading (and returning) its remaining
// lines; SIGKILLs its group after `timeout`. Returns the wait status.
int wait_job(Job& job, std::chrono::milliseconds timeout, std::vector<Line>* lines);

// Stops the job: SIGTERM to kolorun (which stops its workers), SIGKILL to
// its group after 15 s. Returns the exit status.
int stop_job(Job& job);

}  // namespace kolo::bench
