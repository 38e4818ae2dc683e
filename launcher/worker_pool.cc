// The worker pool (worker_pool.h): one poll() over the signalfd and every
// worker's stdout/stderr pipe.
#include "worker_pool.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "comm/shm_segment.h"
#include "proc_stat.h"

namespace kolo::launcher {
namespace {

// After the last worker exits, how long output pipes held open by stray
// descendants are still read before kolorun gives up on them.
constexpr auto kDrainAfterExit = std::chrono::seconds(2);
constexpr size_t kReadChunkBytes = 64 * 1024;
constexpr size_t kMaxBytesPerPoll = 1024 * 1024;  // fairness between workers

WorkerPool::Clock::duration seconds_of(double s) {
  return std::chrono::duration_cast<WorkerPool::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

WorkerPool::WorkerPool(const WorkerPoolOptions& options, OutputRouter& output)
    : options_(options), output_(output) {}

WorkerPool::~WorkerPool() {
  for (auto& worker : workers_) {
    if (!worker.exited) {
      ::kill(-worker.process.pid, SIGKILL);
      waitpid(worker.process.pid, nullptr, 0);
    }
    for (int fd : {worker.process.stdout_fd, worker.process.stderr_fd, worker.process.stdin_fd}) {
      if (fd >= 0) close(fd);
    }
  }
}

void WorkerPool::add(int id, const std::string& host, bool remote, const SpawnedProcess& process) {
  PoolWorker worker;
  worker.id = id;
  worker.host = host;
  worker.remote = remote;
  worker.process = process;
  workers_.push_back(std::move(worker));
}

PoolWorker* WorkerPool::find_mutable(int id) {
  for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) {
    if (it->id == id) return &*it;
  }
  return nullptr;
}

const PoolWorker* WorkerPool::find(int id) const {
  for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) {
    if (it->id == id) return &*it;
  }
  return nullptr;
}

void WorkerPool::stop(int id, int signal_number) {
  PoolWorker* worker = find_mutable(id);
  if (worker == nullptr || worker->exited) return;
  if (worker->remote) {
    // End-of-file on its ssh's stdin makes the remote script stop the worker.
    if (worker->process.stdin_fd >= 0) {
      close(worker->process.stdin_fd);
      worker->process.stdin_fd = -1;
    }
  } else {
    ::kill(-worker->process.pid, signal_number);
    // A stopped (SIGSTOP, SIGTSTP) worker would only see the signal once continued.
    ::kill(-worker->process.pid, SIGCONT);
  }
  worker->stop_sent = true;
  if (!worker->kill_at) worker->kill_at = Clock::now() + seconds_of(options_.grace_seconds);
}

void WorkerPool::stop_all(int signal_number) {
  for (auto& worker : workers_) stop(worker.id, signal_number);
}

void WorkerPool::send_kill(PoolWorker& worker) {
  if (worker.exited || worker.killed) return;
  worker.killed = true;
  worker.stop_sent = true;
  ::kill(-worker.process.pid, SIGKILL);
}

void WorkerPool::kill(int id) {
  PoolWorker* worker = find_mutable(id);
  if (worker != nullptr) send_kill(*worker);
}

void WorkerPool::kill_all() {
  for (auto& worker : workers_) send_kill(worker);
}

void WorkerPool::step(std::optional<Clock::duration> max_wait) {
  const auto now = Clock::now();
  for (auto& worker : workers_) {
    if (worker.exited || worker.killed || !worker.kill_at) continue;
    if (now >= *worker.kill_at) {
      send_kill(worker);
    } else if (!max_wait || *max_wait > *worker.kill_at - now) {
      max_wait = *worker.kill_at - now;
    }
  }

  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, Stream>> owners;
  fds.push_back({options_.signal_fd, POLLIN, 0});
  owners.emplace_back(0, Stream::kStdout);
  for (size_t i = 0; i < workers_.size(); ++i) {
    const auto& p = workers_[i].process;
    if (p.stdout_fd >= 0) {
      fds.push_back({p.stdout_fd, POLLIN, 0});
      owners.emplace_back(i, Stream::kStdout);
    }
    if (p.stderr_fd >= 0) {
      fds.push_back({p.stderr_fd, POLLIN, 0});
      owners.emplace_back(i, Stream::kStderr);
    }
  }
  int timeout_ms = -1;
  if (max_wait) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*max_wait).count() + 1;
    timeout_ms = static_cast<int>(std::min<long long>(std::max<long long>(ms, 0), 60000));
    if (*max_wait <= Clock::duration::zero()) timeout_ms = 0;
  }
  const int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0 && errno != EINTR) {
    // poll on valid descriptors does not fail otherwise; avoid a busy loop anyway.
    usleep(10000);
  }
  if (ready > 0) {
    if (fds[0].revents != 0) handle_signals();
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents != 0) pump(workers_[owners[k].first], owners[k].second);
    }
  }
  // SIGCHLD can be merged or arrive between polls: reaping every step is cheap.
  reap();
}

sigset_t kolorun_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF,
                  SIGPWR, SIGUSR1, SIGUSR2}) {
    sigaddset(&set, sig);
  }
  return set;
}

bool is_forwarded_signal(int signal_number) {
  return signal_number == SIGUSR1 || signal_number == SIGUSR2;
}

int stop_signal_for(int signal_number) {
  return signal_number == SIGINT || signal_number == SIGTERM || signal_number == SIGHUP
             ? signal_number
             : SIGTERM;
}

void WorkerPool::handle_signals() {
  signalfd_siginfo info;
  while (read(options_.signal_fd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every step
    if (is_forwarded_signal(sig)) {
      forward(sig);
      continue;
    }
    if (on_signal_) on_signal_(sig);
  }
}

void WorkerPool::forward(int signal_number) {
  int local = 0, remote = 0;
  for (const PoolWorker& worker : workers_) {
    if (worker.exited) continue;
    if (worker.remote) {
      ++remote;  // its ssh client would die of it: not passed on
      continue;
    }
    ::kill(-worker.process.pid, signal_number);
    ++local;
  }
  std::string line = "kolorun: passed " + signal_name(signal_number) + " on to " +
                     std::to_string(local) + " local worker(s)";
  if (remote > 0) line += "; not to the " + std::to_string(remote) + " on other hosts";
  line += "\n";
  if (write(2, line.data(), line.size()) < 0) {
    // stderr closed: nothing else to tell
  }
}

void WorkerPool::reap() {
  for (;;) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    size_t index = workers_.size();
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].process.pid == pid && !workers_[i].exited) index = i;
    }
    const bool ours = index < workers_.size();
    // A shm rendezvous that a signal interrupted leaves its segment's name
    // (shm_segment.h); the zombie's pid cannot have been reused yet.
    if (ours && !workers_[index].remote) kolo::detail::remove_segments_of(pid);
    // A worker's leftovers in its group go with it (spawn.h).
    int status = 0;
    if (!reap_group_leader(pid, ours, &status) || !ours) continue;
    PoolWorker& worker = workers_[index];
    worker.exited = true;
    worker.status = status;
    worker.kill_at.reset();
    if (worker.process.stdin_fd >= 0) {
      close(worker.process.stdin_fd);
      worker.process.stdin_fd = -1;
    }
    const PoolWorker exited = worker;  // the callback may add workers (and move this one)
    if (on_exit_) on_exit_(exited);
  }
}

void WorkerPool::pump(PoolWorker& worker, Stream stream) {
  int& fd = stream == Stream::kStdout ? worker.process.stdout_fd : worker.process.stderr_fd;
  char buffer[kReadChunkBytes];
  size_t total = 0;
  while (fd >= 0 && total < kMaxBytesPerPoll) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      output_.feed(worker.id, stream, buffer, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close_output(worker, stream);  // EOF or a read error
    }
  }
}

void WorkerPool::close_output(PoolWorker& worker, Stream stream) {
  int& fd = stream == Stream::kStdout ? worker.process.stdout_fd : worker.process.stderr_fd;
  if (fd < 0) return;
  close(fd);
  fd = -1;
  output_.flush(worker.id, stream);
}

void WorkerPool::finish() {
  const auto drain_until = Clock::now() + kDrainAfterExit;
  while (any_output_open()) {
    const auto now = Clock::now();
    if (now >= drain_until) {
      for (auto& worker : workers_) {
        close_output(worker, Stream::kStdout);
        close_output(worker, Stream::kStderr);
      }
      break;
    }
    step(drain_until - now);
  }
  reap_strays();
}

void WorkerPool::reap_strays() {
  // kolorun is a child subreaper: descendants that left their worker's process
  // group (setsid) end up here when their parent exits. Kill and reap them.
  const pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const std::optional<detail::ProcStat> stat = detail::read_proc_stat(static_cast<pid_t>(pid));
    if (stat && stat->ppid == self) {
      ::kill(static_cast<pid_t>(pid), SIGKILL);
      waitpid(static_cast<pid_t>(pid), nullptr, 0);
    }
  }
  closedir(proc);
}

bool WorkerPool::all_exited() const {
  return std::all_of(workers_.begin(), workers_.end(),
                     [](const PoolWorker& worker) { return worker.exited; });
}

bool WorkerPool::any_output_open() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const PoolWorker& worker) {
    return worker.process.stdout_fd >= 0 || worker.process.stderr_fd >= 0;
  });
}

int WorkerPool::killed_count() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const PoolWorker& worker) { return worker.killed; }));
}

int WorkerPool::running_count() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const PoolWorker& worker) { return !worker.exited; }));
}

}  // namespace kolo::launcher
