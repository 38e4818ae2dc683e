// kolorun's static mode (supervisor.h): the failure policy over the worker pool.
#include "supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <system_error>

#include "spawn.h"
#include "worker_env.h"

namespace kolo::launcher {
namespace {

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
    : options_(options),
      output_(output),
      pool_(WorkerPoolOptions{options.grace_seconds, options.signal_fd}, output),
      start_(Clock::now()) {
  pool_.set_exit_callback([this](const PoolWorker& worker) { on_exit(worker); });
  pool_.set_signal_callback([this](int signal_number) { on_signal(signal_number); });
}

void Supervisor::add(const WorkerProcess& worker) {
  pool_.add(worker.rank, worker.host, worker.remote, worker.process);
  // A job already stopping (signal during the spawns) stops newcomers too.
  if (stopping_) pool_.stop(worker.rank, SIGTERM);
}

void Supervisor::start_failed(int rank, const std::string& reason) {
  if (cause_ == Cause::kNone) {
    cause_ = Cause::kStartFailure;
    cause_rank_ = rank;
    start_error_ = reason;
  }
  begin_stop(SIGTERM);
}

void Supervisor::poll_once() {
  until_job_timeout();
  pool_.step(Clock::duration::zero());
  poll_evictions();
}

Outcome Supervisor::run() {
  for (;;) {
    start_restarts();
    if (pool_.all_exited()) break;
    pool_.step(next_wait());
    poll_evictions();
  }
  pool_.finish();
  return outcome();
}

// Stops the job when --job-timeout has passed; otherwise how long until it does.
std::optional<Supervisor::Clock::duration> Supervisor::until_job_timeout() {
  if (!options_.job_timeout_seconds || stopping_) return std::nullopt;
  const auto limit = start_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(*options_.job_timeout_seconds));
  const auto now = Clock::now();
  if (now < limit) return limit - now;
  cause_ = Cause::kJobTimeout;
  begin_stop(SIGTERM);
  return std::nullopt;
}

std::optional<Supervisor::Clock::duration> Supervisor::next_wait() {
  std::optional<Clock::duration> wait = until_job_timeout();
  if (options_.evictions && !stopping_) {
    const Clock::duration poll = std::chrono::milliseconds(200);
    wait = wait ? std::min(*wait, poll) : poll;
  }
  return wait;
}

void Supervisor::poll_evictions() {
  if (!options_.evictions || stopping_) return;
  std::vector<detail::EvictionRequest> requests;
  try {
    requests = options_.evictions();
  } catch (const std::exception& e) {
    // The store is kolorun's own: it cannot be unreachable for long. Stop
    // polling rather than repeat the message every interval.
    std::fprintf(stderr, "kolorun: cannot read the parameter servers' eviction requests: %s\n",
                 e.what());
    options_.evictions = nullptr;
    return;
  }
  for (const detail::EvictionRequest& request : requests) {
    const PoolWorker* worker = pool_.find(request.rank);
    if (worker == nullptr || worker->exited || request.rank >= options_.ps_workers) continue;
    const int start =
        generations_.size() > static_cast<size_t>(request.rank) ? generations_[request.rank] : 0;
    if (request.start != start) continue;  // a request about an earlier start
    if (!evicted_.emplace(request.rank, request.why).second)
      continue;  // another server asked first
    std::fprintf(stderr, "kolorun: %s: %s; killing it\n", describe_rank(*worker).c_str(),
                 request.why.c_str());
    std::fflush(stderr);
    pool_.kill(request.rank);
  }
}

std::string Supervisor::describe_end(const PoolWorker& worker) const {
  const auto evicted = evicted_.find(worker.id);
  if (evicted == evicted_.end()) return describe_status(worker.status);
  return "was evicted (" + evicted->second + ") and " + describe_status(worker.status);
}

void Supervisor::on_signal(int signal_number) {
  if (stopping_) {
    // A second signal, or one while a failure is being handled: no more grace.
    pool_.kill_all();
    return;
  }
  cause_ = Cause::kSignal;
  cause_signal_ = signal_number;
  begin_stop(stop_signal_for(signal_number));
}

void Supervisor::on_exit(const PoolWorker& worker) {
  if (failed(worker.status) && !stopping_ && worker.id < options_.ps_workers &&
      restarts_ < options_.restart_workers && options_.restart) {
    restarts_ += 1;
    std::fprintf(stderr,
                 "kolorun: %s %s; restarting it to rejoin the parameter servers (restart %d of "
                 "--restart-workers %d)\n",
                 describe_rank(worker).c_str(), describe_end(worker).c_str(), restarts_,
                 options_.restart_workers);
    std::fflush(stderr);
    pending_restarts_.push_back(worker.id);
    evicted_.erase(worker.id);
    return;
  }
  if (failed(worker.status) && !stopping_) {
    cause_ = Cause::kFailure;
    cause_rank_ = worker.id;
    begin_stop(SIGTERM);
  }
  if (!failed(worker.status) && !stopping_ && options_.on_clean_exit) {
    options_.on_clean_exit(worker.id);
  }
}

void Supervisor::start_restarts() {
  std::vector<int> ranks;
  ranks.swap(pending_restarts_);
  for (int rank : ranks) {
    if (stopping_) return;
    if (generations_.size() <= static_cast<size_t>(rank)) generations_.resize(rank + 1, 0);
    const int generation = ++generations_[rank];
    try {
      add(options_.restart(rank, generation));
    } catch (const std::system_error& e) {
      start_failed(rank, e.what());
    }
  }
}

std::string Supervisor::describe_rank(const PoolWorker& info) const {
  std::string role;
  if (options_.ps_workers > 0) {
    role = info.id < options_.ps_workers
               ? "worker " + std::to_string(info.id)
               : "parameter server " + std::to_string(info.id - options_.ps_workers);
    role += "; ";
  }
  return "rank " + std::to_string(info.id) + " (" + role + "pid " +
         std::to_string(info.process.pid) + (info.remote ? ", ssh to " : " on ") + info.host + ")";
}

void Supervisor::begin_stop(int signal_number) {
  if (!stopping_) {
    stopping_ = true;
    workers_at_stop_ = pool_.running_count();
  }
  pool_.stop_all(signal_number);
}

std::string Supervisor::describe_failure() const {
  const PoolWorker* worker = pool_.find(cause_rank_);
  if (worker == nullptr) return "kolorun: rank " + std::to_string(cause_rank_) + " failed";
  const PoolWorker& info = *worker;
  std::string line = "kolorun: " + describe_rank(info) + " " + describe_end(info);
  if (info.remote && WIFEXITED(worker->status)) {
    int code = WEXITSTATUS(worker->status);
    if (code == 255) line += " (ssh's code for a failed connection or a remote signal)";
    if (code > 128 && code < 255)
      line += " (128 + " + signal_name(code - 128) + " on " + info.host + ")";
  }
  Stream stream = Stream::kStdout;
  std::string last = output_.last_line(info.id, &stream);
  if (last.empty()) {
    line += "; it wrote no output";
  } else {
    line += std::string("; its last output line (") +
            (stream == Stream::kStdout ? "stdout" : "stderr") + "): " + quote_line(last) +
            "; its output went to " + output_.where(info.id);
  }
  return line;
}

Outcome Supervisor::outcome() const {
  Outcome result;
  const int killed_count = pool_.killed_count();
  int others = std::max(0, workers_at_stop_);
  std::string stopped = others == 0
                            ? ""
                            : "; stopped " + std::to_string(others) + " other worker" +
                                  (others == 1 ? "" : "s") +
                                  (killed_count > 0 ? " (" + std::to_string(killed_count) +
                                                          " needed SIGKILL after the grace period)"
                                                    : "");
  switch (cause_) {
    case Cause::kNone:
      return result;  // every worker exited 0 (any failure sets cause_)
    case Cause::kFailure: {
      const PoolWorker* worker = pool_.find(cause_rank_);
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
          (killed_count > 0 ? " (" + std::to_string(killed_count) + " needed SIGKILL)" : "");
      return result;
    case Cause::kJobTimeout:
      result.exit_code = 124;
      result.report =
          "kolorun: the job ran longer than --job-timeout " +
          format_seconds(*options_.job_timeout_seconds) + " s; stopped " +
          std::to_string(workers_at_stop_) + " running worker" +
          (workers_at_stop_ == 1 ? "" : "s") +
          (killed_count > 0 ? " (" + std::to_string(killed_count) + " needed SIGKILL)" : "");
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
