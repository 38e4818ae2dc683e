// The one pool of worker processes under both of kolorun's modes: the static
// Supervisor (supervisor.h) and the ElasticDriver (elastic_driver.h) decide
// what happens; the pool owns the processes and does the mechanics.
//
// Contract:
//  - step() waits (poll) on the signalfd and every worker's stdout/stderr,
//    pumps output to the OutputRouter, reaps exited workers and reports each
//    exit once through the exit callback, and each received signal through
//    the signal callback. A worker's leftovers in its process group are
//    SIGKILLed when it exits (spawn.h): no orphans; so are the names of shm
//    segments a local worker created and a signal kept it from removing
//    (comm/shm_segment.h).
//  - stop(id) asks one worker to end: SIGTERM (or the given signal) to its
//    process group followed by SIGCONT, so that a stopped worker can act on
//    it; a remote worker's ssh gets end-of-file on its stdin instead
//    (ssh_command.h). Whatever the worker does, it is SIGKILLed once --grace
//    has passed since its stop: escalation exists here and nowhere else.
//  - kill(id) SIGKILLs at once (a second signal to kolorun; an elastic
//    eviction).
//  - finish() is called once every worker has exited: it reads what stray
//    descendants still write to the pipes for a short while, then SIGKILLs
//    and reaps whatever descendants are left (kolorun is a child subreaper).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "output.h"
#include "spawn.h"

namespace kolo::launcher {

struct PoolWorker {
  int id = 0;  // rank (static mode) or worker id (elastic): its output slot
  std::string host;
  bool remote = false;
  SpawnedProcess process;
  bool exited = false;
  int status = 0;          // wait status, once exited
  bool stop_sent = false;  // stop() or kill() was called
  bool killed = false;     // SIGKILL was sent (escalation or kill())
  std::optional<std::chrono::steady_clock::time_point> kill_at;  // escalation deadline
};

// The signals kolorun handles, blocked in every thread and read from a
// signalfd (kolorun's default action for any of them would end it with no
// message and leave its workers' shared memory behind):
//  - SIGCHLD: a worker exited;
//  - the stopping signals, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM,
//    SIGXCPU, SIGVTALRM, SIGPROF, SIGPWR: the job stops (the callback); the
//    workers receive the same signal for INT, TERM and HUP and SIGTERM for the
//    others (a core-dumping SIGQUIT is kolorun's to take, not every worker's);
//  - the forwarded ones, SIGUSR1 and SIGUSR2: passed on to every local
//    worker's process group, the job goes on (a batch system's "checkpoint
//    now" notice reaches the program, as under mpirun; a worker that does not
//    handle it dies, which the job then reports as a failure).
sigset_t kolorun_signals();
bool is_forwarded_signal(int signal_number);
// The signal workers are stopped with when kolorun received `signal_number`.
int stop_signal_for(int signal_number);

struct WorkerPoolOptions {
  double grace_seconds = 5.0;
  // A signalfd reporting kolorun_signals(), which the caller has blocked in
  // every thread.
  int signal_fd = -1;
};

class WorkerPool {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once per worker, after it was reaped (`exited` and `status` set).
  using ExitCallback = std::function<void(const PoolWorker&)>;
  // Called for each stopping signal kolorun receives (kolorun_signals()).
  using SignalCallback = std::function<void(int signal_number)>;

  WorkerPool(const WorkerPoolOptions& options, OutputRouter& output);
  // SIGKILLs and reaps whatever still runs (normally nothing: an exception
  // between add() and the end of the job).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void set_exit_callback(ExitCallback callback) { on_exit_ = std::move(callback); }
  void set_signal_callback(SignalCallback callback) { on_signal_ = std::move(callback); }

  // A started worker; the pool now owns its descriptors. `id` must be new,
  // or its earlier worker must have exited (a restart: find() then gives
  // the newest).
  void add(int id, const std::string& host, bool remote, const SpawnedProcess& process);

  void stop(int id, int signal_number = SIGTERM);
  void stop_all(int signal_number = SIGTERM);
  void kill(int id);
  void kill_all();

  // Waits up to `max_wait` (nullopt: until something happens) for output,
  // signals and exits, and handles them; also escalates overdue stops.
  void step(std::optional<Clock::duration> max_wait);
  // See the contract above; returns when every pipe is closed.
  void finish();

  const PoolWorker* find(int id) const;
  const std::vector<PoolWorker>& workers() const { return workers_; }
  bool all_exited() const;
  bool any_output_open() const;
  int running_count() const;
  // Workers that were sent SIGKILL (their grace ran out, or kill()).
  int killed_count() const;

 private:
  PoolWorker* find_mutable(int id);
  void handle_signals();
  // Sends a forwarded signal (is_forwarded_signal) to every running local
  // worker's process group and says so on stderr.
  void forward(int signal_number);
  void reap();
  void pump(PoolWorker& worker, Stream stream);
  void close_output(PoolWorker& worker, Stream stream);
  void send_kill(PoolWorker& worker);
  void reap_strays();

  WorkerPoolOptions options_;
  OutputRouter& output_;
  std::vector<PoolWorker> workers_;
  ExitCallback on_exit_;
  SignalCallback on_signal_;
};

}  // namespace kolo::launcher
