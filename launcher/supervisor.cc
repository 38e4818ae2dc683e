// The supervision loop (supervisor.h): one poll() over the signalfd and every
// worker's stdout/stderr pipe.
#include "supervisor.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "spawn.h"
#include "worker_env.h"

namespace kolo::launcher {
namespace {

// After the last worker exits, how long output pipes held open by stray
// descendants are still read before kolorun gives up on them.
constexpr auto kDrainAfterExit = std::chrono::seconds(2);
constexpr size_t kReadChunkBytes = 64 * 1024;
constexpr size_t kMaxBytesPerPoll = 1024 * 1024;  // fairness between ranks

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

std::string quote_line(const std::string& line, size_t max_chars) {
  std::string out = "\"";
  size_t kept = 0;
  for (char c : line) {
    if (kept == max_chars) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", u);
      out += buffer;
    } else {
      out += c;
    }
    ++kept;
  }
  return out + "\"";
}

Supervisor::Supervisor(const SupervisorOptions& options, OutputRouter& output)
    : options_(options), output_(output), start_(Clock::now()) {}

Supervisor::~Supervisor() {
  // run() normally leaves nothing behind; this covers an exception in between.
  for (auto& worker : workers_) {
    if (!worker.exited) {
      kill(-worker.info.process.pid, SIGKILL);
      waitpid(worker.info.process.pid, nullptr, 0);
    }
    for (int fd : {worker.info.process.stdout_fd, worker.info.process.stderr_fd,
                   worker.info.process.stdin_fd}) {
      if (fd >= 0) close(fd);
    }
  }
}

void Supervisor::add(const WorkerProcess& worker) {
  workers_.push_back(Worker{worker});
  // A job already stopping (signal during the spawns) stops newcomers too.
  if (stopping_) stop_worker(workers_.back(), SIGTERM);
}

void Supervisor::start_failed(int rank, const std::string& reason) {
  if (cause_ == Cause::kNone) {
    cause_ = Cause::kStartFailure;
    cause_rank_ = rank;
    start_error_ = reason;
  }
  begin_stop(SIGTERM);
}

void Supervisor::poll_once() { step(Clock::duration::zero()); }

Outcome Supervisor::run() {
  while (!all_exited() || any_output_open()) step(std::nullopt);
  reap_strays();
  return outcome();
}

void Supervisor::step(std::optional<Clock::duration> max_wait) {
  auto now = Clock::now();
  if (options_.job_timeout_seconds && !stopping_) {
    auto limit = start_ + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(*options_.job_timeout_seconds));
    if (now >= limit) {
      cause_ = Cause::kJobTimeout;
      begin_stop(SIGTERM);
    } else if (!max_wait || *max_wait > limit - now) {
      max_wait = limit - now;
    }
  }
  if (kill_deadline_) {
    if (now >= *kill_deadline_) {
      kill_all();
      kill_deadline_.reset();
    } else if (!max_wait || *max_wait > *kill_deadline_ - now) {
      max_wait = *kill_deadline_ - now;
    }
  }
  if (all_exited() && any_output_open()) {
    if (!drain_deadline_) drain_deadline_ = now + kDrainAfterExit;
    if (now >= *drain_deadline_) {
      for (auto& worker : workers_) {
        close_output(worker, Stream::kStdout);
        close_output(worker, Stream::kStderr);
      }
      return;
    }
    if (!max_wait || *max_wait > *drain_deadline_ - now) max_wait = *drain_deadline_ - now;
  }

  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, Stream>> owners;
  fds.push_back({options_.signal_fd, POLLIN, 0});
  owners.emplace_back(0, Stream::kStdout);
  for (size_t i = 0; i < workers_.size(); ++i) {
    const auto& p = workers_[i].info.process;
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
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*max_wait).count() + 1;
    timeout_ms = static_cast<int>(std::min<long long>(std::max<long long>(ms, 0), 60000));
    if (*max_wait == Clock::duration::zero()) timeout_ms = 0;
  }
  int ready = poll(fds.data(), fds.size(), timeout_ms);
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

void Supervisor::handle_signals() {
  signalfd_siginfo info;
  while (read(options_.signal_fd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every step
    if (stopping_) {
      // A second signal, or one while a failure is being handled: no more grace.
      kill_all();
      kill_deadline_.reset();
      continue;
    }
    cause_ = Cause::kSignal;
    cause_signal_ = sig;
    begin_stop(sig);
  }
}

void Supervisor::reap() {
  while (true) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    pid_t pid = info.si_pid;
    Worker* worker = nullptr;
    for (auto& w : workers_) {
      if (w.info.process.pid == pid && !w.exited) worker = &w;
    }
    // A worker's leftovers in its group go with it (spawn.h).
    int status = 0;
    if (reap_group_leader(pid, worker != nullptr, &status) && worker != nullptr) {
      on_exit(*worker, status);
    }
  }
}

void Supervisor::on_exit(Worker& worker, int status) {
  worker.exited = true;
  worker.status = status;
  if (worker.info.process.stdin_fd >= 0) {
    close(worker.info.process.stdin_fd);
    worker.info.process.stdin_fd = -1;
  }
  if (failed(status) && !stopping_) {
    cause_ = Cause::kFailure;
    cause_rank_ = worker.info.rank;
    begin_stop(SIGTERM);
  }
}

void Supervisor::pump(Worker& worker, Stream stream) {
  int& fd =
      stream == Stream::kStdout ? worker.info.process.stdout_fd : worker.info.process.stderr_fd;
  char buffer[kReadChunkBytes];
  size_t total = 0;
  while (fd >= 0 && total < kMaxBytesPerPoll) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      output_.feed(worker.info.rank, stream, buffer, static_cast<size_t>(n));
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

void Supervisor::close_output(Worker& worker, Stream stream) {
  int& fd =
      stream == Stream::kStdout ? worker.info.process.stdout_fd : worker.info.process.stderr_fd;
  if (fd < 0) return;
  close(fd);
  fd = -1;
  output_.flush(worker.info.rank, stream);
}

void Supervisor::begin_stop(int signal_number) {
  if (!stopping_) {
    stopping_ = true;
    workers_at_stop_ = running_count();
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.grace_seconds));
  }
  for (auto& worker : workers_) {
    if (!worker.exited) stop_worker(worker, signal_number);
  }
}

void Supervisor::stop_worker(Worker& worker, int signal_number) {
  if (worker.exited) return;
  if (worker.info.remote) {
    // End-of-file on its ssh's stdin makes the remote script stop the worker.
    if (worker.info.process.stdin_fd >= 0) {
      close(worker.info.process.stdin_fd);
      worker.info.process.stdin_fd = -1;
    }
  } else {
    kill(-worker.info.process.pid, signal_number);
  }
  worker.stop_sent = true;
}

void Supervisor::kill_all() {
  for (auto& worker : workers_) {
    if (worker.exited) continue;
    if (!worker.killed) ++killed_count_;
    worker.killed = true;
    kill(-worker.info.process.pid, SIGKILL);
  }
}

void Supervisor::reap_strays() {
  // kolorun is a child subreaper: descendants that left their worker's process
  // group (setsid) end up here when their parent exits. Kill and reap them.
  pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(text.substr(paren + 2));
    char state;
    long ppid = 0;
    fields >> state >> ppid;
    if (ppid == self) {
      kill(static_cast<pid_t>(pid), SIGKILL);
      waitpid(static_cast<pid_t>(pid), nullptr, 0);
    }
  }
  closedir(proc);
}

bool Supervisor::all_exited() const {
  for (const auto& worker : workers_) {
    if (!worker.exited) return false;
  }
  return true;
}

bool Supervisor::any_output_open() const {
  for (const auto& worker : workers_) {
    if (worker.info.process.stdout_fd >= 0 || worker.info.process.stderr_fd >= 0) return true;
  }
  return false;
}

int Supervisor::running_count() const {
  int count = 0;
  for (const auto& worker : workers_) count += worker.exited ? 0 : 1;
  return count;
}

std::string Supervisor::describe_failure() const {
  const Worker* worker = nullptr;
  for (const auto& w : workers_) {
    if (w.info.rank == cause_rank_) worker = &w;
  }
  if (worker == nullptr) return "kolorun: rank " + std::to_string(cause_rank_) + " failed";
  const auto& info = worker->info;
  std::string line = "kolorun: rank " + std::to_string(info.rank) + " (pid " +
                     std::to_string(info.process.pid) + (info.remote ? ", ssh to " : " on ") +
                     info.host + ") " + describe_status(worker->status);
  if (info.remote && WIFEXITED(worker->status)) {
    int code = WEXITSTATUS(worker->status);
    if (code == 255) line += " (ssh's code for a failed connection or a remote signal)";
    if (code > 128 && code < 255)
      line += " (128 + " + signal_name(code - 128) + " on " + info.host + ")";
  }
  Stream stream = Stream::kStdout;
  std::string last = output_.last_line(info.rank, &stream);
  if (last.empty()) {
    line += "; it wrote no output";
  } else {
    line += std::string("; its last output line (") +
            (stream == Stream::kStdout ? "stdout" : "stderr") + "): " + quote_line(last) +
            "; its output went to " + output_.where(info.rank);
  }
  return line;
}

Outcome Supervisor::outcome() const {
  Outcome result;
  int others = std::max(0, workers_at_stop_);
  std::string stopped = others == 0
                            ? ""
                            : "; stopped " + std::to_string(others) + " other worker" +
                                  (others == 1 ? "" : "s") +
                                  (killed_count_ > 0 ? " (" + std::to_string(killed_count_) +
                                                           " needed SIGKILL after the grace period)"
                                                     : "");
  switch (cause_) {
    case Cause::kNone:
      return result;  // every worker exited 0 (any failure sets cause_)
    case Cause::kFailure: {
      const Worker* worker = nullptr;
      for (const auto& w : workers_) {
        if (w.info.rank == cause_rank_) worker = &w;
      }
      result.exit_code = worker != nullptr ? exit_code_of(worker->status) : 1;
      if (result.exit_code == 0) result.exit_code = 1;
      result.report = describe_failure() + stopped;
      return result;
    }
    case Cause::kSignal:
      result.exit_code = 128 + cause_signal_;
      result.report =
          "kolorun: received " + signal_name(cause_signal_) + "; stopped " +
          std::to_string(workers_at_stop_) + " running worker" +
          (workers_at_stop_ == 1 ? "" : "s") +
          (killed_count_ > 0 ? " (" + std::to_string(killed_count_) + " needed SIGKILL)" : "");
      return result;
    case Cause::kJobTimeout:
      result.exit_code = 124;
      result.report =
          "kolorun: the job ran longer than --job-timeout " +
          format_seconds(*options_.job_timeout_seconds) + " s; stopped " +
          std::to_string(workers_at_stop_) + " running worker" +
          (workers_at_stop_ == 1 ? "" : "s") +
          (killed_count_ > 0 ? " (" + std::to_string(killed_count_) + " needed SIGKILL)" : "");
      return result;
    case Cause::kStartFailure:
      result.exit_code = 1;
      result.report =
          "kolorun: cannot start rank " + std::to_string(cause_rank_) + ": " + start_error_ +
          (workers_at_stop_ > 0
               ? "; stopped the " + std::to_string(workers_at_stop_) + " workers already started"
               : "");
      return result;
  }
  return result;
}

}  // namespace kolo::launcher
