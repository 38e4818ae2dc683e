#include "engine/stall_inspector.h"

#include <algorithm>
#include <cstdio>

#include "kolo/core/communicator.h"

namespace kolo::detail {

namespace {

StallInspector::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<StallInspector::Clock::duration>(
      std::chrono::duration<double>(s));
}

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", s);
  return text;
}

}  // namespace

StallInspector::StallInspector(Options options, Logger logger)
    : options_(std::move(options)),
      logger_(logger),
      warning_(seconds(options_.warning_seconds)),
      shutdown_(seconds(options_.shutdown_seconds)) {}

std::string StallInspector::ranks_text(const std::vector<int>& set_ranks) const {
  std::string text = set_ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < set_ranks.size(); ++i) {
    const int r = set_ranks[i];
    const int world =
        r < static_cast<int>(options_.world_ranks.size()) ? options_.world_ranks[r] : r;
    text += (i > 0 ? ", " : "") + std::to_string(world);
  }
  return text;
}

std::vector<StallVerdict> StallInspector::inspect(const std::vector<Waiting>& stalled,
                                                  Clock::time_point now) {
  std::vector<StallVerdict> verdicts;
  if (stalled.empty()) {
    warned_ = false;
    return verdicts;
  }
  const std::string where =
      options_.process_set == 0 ? "" : " in process set " + std::to_string(options_.process_set);
  if (!warned_ || now - last_warning_ >= warning_) {
    warned_ = true;
    last_warning_ = now;
    std::string message = "stall: " + std::to_string(stalled.size()) + " request(s)" + where +
                          " submitted by some ranks but not others for " + "more than " +
                          format_seconds(options_.warning_seconds) +
                          " s (KOLO_STALL_WARNING_SECONDS):";
    for (const Waiting& w : stalled) {
      const double waited = std::chrono::duration<double>(now - w.since).count();
      message += "\n  '" + w.name + "' (" + request_kind_name(w.kind) + ", " +
                 format_seconds(waited) + " s): missing " + ranks_text(w.missing) +
                 "; submitted by " + ranks_text(w.submitted);
    }
    if (options_.shutdown_seconds > 0) {
      message += "\n  they fail with RuntimeFault after " +
                 format_seconds(options_.shutdown_seconds) + " s (KOLO_STALL_SHUTDOWN_SECONDS)";
    }
    logger_.warning(message);
  }
  if (options_.shutdown_seconds > 0) {
    for (const Waiting& w : stalled) {
      if (now - w.since < shutdown_) continue;
      StallVerdict v;
      v.name = w.name;
      v.missing.assign(w.missing.begin(), w.missing.end());
      v.waited_seconds = std::chrono::duration<double>(now - w.since).count();
      verdicts.push_back(std::move(v));
    }
  }
  return verdicts;
}

// ---- WatchThread -----------------------------------------------------------

WatchThread::WatchThread(std::mutex& mutex, Clock::duration warning,
                         std::function<void(Clock::time_point)> check)
    : mutex_(mutex) {
  const auto period = std::clamp<Clock::duration>(warning / 4, std::chrono::milliseconds(10),
                                                  std::chrono::seconds(1));
  thread_ = std::thread([this, period, check = std::move(check)] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, period);
      if (!stop_) check(Clock::now());
    }
  });
}

WatchThread::~WatchThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

// ---- NegotiationWatch ------------------------------------------------------

NegotiationWatch::NegotiationWatch(Options options, Logger logger)
    : options_(options),
      logger_(logger),
      warning_(seconds(options.warning_seconds)),
      shutdown_(seconds(options.shutdown_seconds)),
      thread_(mutex_, warning_, [this](Clock::time_point now) { check(now); }) {}

NegotiationWatch::~NegotiationWatch() = default;

void NegotiationWatch::enter(Communicator* comm, const std::vector<int>* world_ranks, int set_rank,
                             int process_set) {
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = comm;
  world_ranks_ = world_ranks;
  set_rank_ = set_rank;
  process_set_ = process_set;
  since_ = Clock::now();
  warned_ = false;
}

void NegotiationWatch::leave() {
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = nullptr;
  world_ranks_ = nullptr;
}

std::string NegotiationWatch::ranks_text(const std::vector<int>& set_ranks) const {
  std::string text = set_ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < set_ranks.size(); ++i) {
    const int r = set_ranks[i];
    const int world = world_ranks_ != nullptr && r < static_cast<int>(world_ranks_->size())
                          ? (*world_ranks_)[r]
                          : r;
    text += (i > 0 ? ", " : "") + std::to_string(world);
  }
  return text;
}

void NegotiationWatch::check(Clock::time_point now) {
  if (comm_ == nullptr || aborted_) return;
  const auto waited = now - since_;
  if (waited < warning_) return;
  const std::optional<std::vector<int>> missing = comm_->waiting_for();
  if (missing && missing->empty()) return;  // between two waits of the negotiation
  const double waited_s = std::chrono::duration<double>(waited).count();
  const std::string who =
      missing ? ranks_text(*missing)
              : "a rank (the " + std::string(comm_->backend()) + " backend cannot tell which)";
  const std::string where =
      process_set_ == 0 ? "" : " of process set " + std::to_string(process_set_);
  const bool shut_down = options_.shutdown_seconds > 0 && waited >= shutdown_;
  if (shut_down) {
    const std::string reason =
        "kolo engine: " + who + " did not take part in the negotiation" + where + " for " +
        format_seconds(waited_s) +
        " s (KOLO_STALL_SHUTDOWN_SECONDS): frozen (SIGSTOP, a debugger), stuck, or its engine "
        "thread is blocked; this rank gives up on the world";
    std::vector<int> failed;
    if (missing) {
      for (int r : *missing) {
        failed.push_back(world_ranks_ != nullptr && r < static_cast<int>(world_ranks_->size())
                             ? (*world_ranks_)[r]
                             : r);
      }
    }
    logger_.error(reason);
    aborted_ = comm_->abort(reason, failed);
    if (options_.on_abort) options_.on_abort(reason, failed);
    return;
  }
  // The lowest rank that is not missing speaks for everyone waiting.
  bool speaker = true;
  if (missing) {
    for (int r = 0; r < set_rank_; ++r) {
      if (std::find(missing->begin(), missing->end(), r) == missing->end()) speaker = false;
    }
  }
  if (!speaker || (warned_ && now - last_warning_ < warning_)) return;
  warned_ = true;
  last_warning_ = now;
  std::string message = "stall: the negotiation" + where + " has waited " +
                        format_seconds(waited_s) + " s (more than KOLO_STALL_WARNING_SECONDS " +
                        format_seconds(options_.warning_seconds) + ") for " + who +
                        ": frozen (SIGSTOP, a debugger), stuck, its engine thread blocked, or "
                        "busy in a long collective of another process set";
  if (options_.shutdown_seconds > 0) {
    message += "; pending requests fail with RuntimeFault after " +
               format_seconds(options_.shutdown_seconds) + " s (KOLO_STALL_SHUTDOWN_SECONDS)";
  }
  logger_.warning(message);
}

// ---- P2PWatch ----------------------------------------------------------------

P2PWatch::P2PWatch(Communicator* comm, Options options, Logger logger)
    : options_(options),
      logger_(logger),
      warning_(seconds(options.warning_seconds)),
      shutdown_(seconds(options.shutdown_seconds)),
      comm_(comm),
      rank_(comm->rank()),
      thread_(mutex_, warning_, [this](Clock::time_point now) { check(now); }) {}

std::string P2PWatch::name_of(int rank) const {
  std::string name = "rank " + std::to_string(rank);
  if (rank >= 0 && rank < static_cast<int>(options_.world_ranks.size())) {
    name += " (world rank " + std::to_string(options_.world_ranks[rank]) + ")";
  }
  return name;
}

uint64_t P2PWatch::enter(P2PKind kind, int peer, int tag, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  Wait wait;
  wait.kind = kind;
  wait.peer = peer;
  wait.tag = tag;
  wait.since = Clock::now();
  const Clock::duration period = options_.shutdown_seconds > 0 ? shutdown_ : warning_;
  wait.exempt = timeout.count() > 0 && timeout > period;
  waits_.emplace(next_id_, wait);
  return next_id_++;
}

void P2PWatch::leave(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  waits_.erase(id);
}

void P2PWatch::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = nullptr;
}

void P2PWatch::check(Clock::time_point now) {
  if (aborted_) return;
  for (auto& [id, wait] : waits_) {
    const auto waited = now - wait.since;
    if (wait.exempt || waited < warning_) continue;
    const double waited_s = std::chrono::duration<double>(waited).count();
    const std::string transfer =
        std::string(wait.kind == P2PKind::kSend ? "send to " : "recv from ") + name_of(wait.peer) +
        " (tag " + std::to_string(wait.tag) + ")";
    const std::string what = name_of(rank_) + " has waited " + format_seconds(waited_s) + " s in " +
                             transfer + ": " + name_of(wait.peer) +
                             " has not posted the matching " +
                             (wait.kind == P2PKind::kSend ? "recv" : "send");
    const std::string hint =
        " (it runs another plan: a different schedule, step count or tag; it is stuck, waiting "
        "for this rank itself, or slow)";
    if (options_.shutdown_seconds > 0 && waited >= shutdown_ && comm_ != nullptr) {
      const std::string reason = "kolo " + what + " for more than KOLO_STALL_SHUTDOWN_SECONDS (" +
                                 format_seconds(options_.shutdown_seconds) + " s)" + hint +
                                 "; this rank gives up on the communicator";
      logger_.error(reason);
      // Once: a backend that cannot end the wait (mpi) ends it at its timeout.
      comm_->abort(reason, {wait.peer});
      aborted_ = true;
      return;
    }
    if (wait.warned && now - wait.last_warning < warning_) continue;
    wait.warned = true;
    wait.last_warning = now;
    std::string message = "stall: " + what + " (more than KOLO_STALL_WARNING_SECONDS " +
                          format_seconds(options_.warning_seconds) + ")" + hint;
    if (options_.shutdown_seconds > 0) {
      message += "; the transfer fails with RuntimeFault after " +
                 format_seconds(options_.shutdown_seconds) + " s (KOLO_STALL_SHUTDOWN_SECONDS)";
    }
    logger_.warning(message);
  }
}

}  // namespace kolo::detail
