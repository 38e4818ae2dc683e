// kolorun's static mode: what happens when a worker fails or kolorun is
// signalled. The mechanics (output, reaping, escalation) are the WorkerPool's
// (worker_pool.h), shared with elastic mode.
//
// Contract: when any worker fails (non-zero exit or a signal), or kolorun gets
// SIGINT/SIGTERM/SIGHUP, or --job-timeout passes, every other worker is sent
// SIGTERM (the same signal kolorun received, when forwarding), and SIGKILL
// after the grace period; a second signal to kolorun sends SIGKILL at once.
// Signals go to each worker's whole process group. A remote worker is stopped
// by closing its ssh's stdin (see ssh_command.h) and SIGKILL of ssh after the
// grace. When a worker exits, whatever is left in its process group is
// SIGKILLed: no orphans. run() returns only when every worker has been reaped.
//
// Parameter-server jobs (--servers): reports name each rank's role ("rank 2
// (parameter server 0; pid ...)"). With --restart-workers N, a worker (not a
// server) that fails while the job is not stopping is started again instead,
// at most N times in all, through SupervisorOptions::restart; the job then
// fails only when a failure finds the budget spent. A worker that a
// parameter server evicts (it sent nothing while the others' pulls waited:
// a frozen process; exit_notices.h) is SIGKILLed and reported as evicted,
// then handled as any failed worker: restarted, or the job's failure.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "exit_notices.h"
#include "output.h"
#include "spawn.h"
#include "worker_pool.h"

namespace kolo::launcher {

struct WorkerProcess {
  int rank = 0;
  std::string host;
  bool remote = false;
  SpawnedProcess process;
};

struct SupervisorOptions {
  double grace_seconds = 5.0;
  std::optional<double> job_timeout_seconds;
  // A signalfd reporting kolorun_signals() (worker_pool.h), which the caller
  // has blocked in every thread.
  int signal_fd = -1;
  // Called for each rank that exits 0 while the job runs on (not stopping):
  // kolorun tells the other ranks through its store, so that a rank still
  // waiting for it in the rendezvous fails at once naming it instead of
  // waiting out the timeout (detail::kExitedRankKey, kolo/core/store.h).
  std::function<void(int rank)> on_clean_exit;
  // Parameter-server jobs: ranks below ps_workers are workers, the others
  // servers. 0: not a parameter-server job.
  int ps_workers = 0;
  // --restart-workers: restarts of failed workers (ranks < ps_workers), in all.
  int restart_workers = 0;
  // Starts rank `rank` again as its `generation`-th restart; throws
  // std::system_error when it cannot (the job then stops).
  std::function<WorkerProcess(int rank, int generation)> restart;
  // Parameter-server jobs: the eviction requests made since the last call
  // (detail::new_evictions), polled every few hundred milliseconds.
  std::function<std::vector<detail::EvictionRequest>()> evictions;
};

struct Outcome {
  int exit_code = 0;   // 0 when every worker exited 0
  std::string report;  // one line for stderr ("kolorun: ..."), empty on success
};

class Supervisor {
 public:
  Supervisor(const SupervisorOptions& options, OutputRouter& output);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // A worker was started; the supervisor now owns its descriptors.
  void add(const WorkerProcess& worker);
  // Starting rank `rank` failed: the job will stop the started workers and
  // report `reason`.
  void start_failed(int rank, const std::string& reason);
  // True once the job is stopping (a failure or a signal arrived): do not start
  // more workers.
  bool stopping() const { return stopping_; }
  // Handles pending signals and output without blocking (called between spawns).
  void poll_once();
  // Runs until every worker has exited; returns kolorun's exit code and report.
  Outcome run();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Cause { kNone, kFailure, kSignal, kJobTimeout, kStartFailure };

  void on_exit(const PoolWorker& worker);
  // Starts the restarts on_exit() queued (not from inside the pool's reaping).
  void start_restarts();
  // Kills the workers that new eviction requests name (their current start).
  void poll_evictions();
  // How long the pool may wait: until --job-timeout, and a poll interval
  // when evictions are polled.
  std::optional<Clock::duration> next_wait();
  // describe_status(), saying first that the worker was evicted if it was.
  std::string describe_end(const PoolWorker& worker) const;
  // "rank 2 (parameter server 0; pid 7 on host)" / "rank 1 (pid 7 on host)".
  std::string describe_rank(const PoolWorker& worker) const;
  void on_signal(int signal_number);
  void begin_stop(int signal_number);
  std::optional<Clock::duration> until_job_timeout();
  Outcome outcome() const;
  std::string describe_failure() const;

  SupervisorOptions options_;
  OutputRouter& output_;
  WorkerPool pool_;
  Clock::time_point start_;
  bool stopping_ = false;
  Cause cause_ = Cause::kNone;
  int cause_rank_ = -1;                // kFailure / kStartFailure
  int cause_signal_ = 0;               // kSignal
  std::string start_error_;            // kStartFailure
  int workers_at_stop_ = 0;            // running workers when the stop began
  int restarts_ = 0;                   // restarts started or queued
  std::vector<int> generations_;       // per rank: its restarts so far
  std::vector<int> pending_restarts_;  // ranks to start again
  // Why each evicted rank was evicted, until its restart (its report of
  // the end of the evicted start reads it).
  std::map<int, std::string> evicted_;
};

// "exited with code 3" / "killed by signal 9 (SIGKILL)" for a wait status.
std::string describe_status(int status);

// Quotes a line for the one-line report: control characters escaped, at most
// `max_chars` characters kept.
std::string quote_line(const std::string& line, size_t max_chars = 200);

}  // namespace kolo::launcher
