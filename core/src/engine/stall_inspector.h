// Stall checks (internal), three of them:
//  - StallInspector: requests some ranks of a process set submitted and others
//    did not (the ranks are all there, negotiating; one never submits);
//  - NegotiationWatch: a rank that does not negotiate at all (frozen, stuck);
//  - P2PWatch: a point-to-point wait whose peer never posts the matching
//    transfer (pipeline stages running different plans), which bypasses the
//    engine and so both checks above.
// The two watches run on a WatchThread each.
//
// StallInspector: finds requests that some ranks of a process set
// submitted and others did not, warns about them, and eventually fails them.
//
// Runs on set rank 0 only, which sees every rank's uncached requests in its
// message table (controller.h). Requests waiting in the cached fast path are
// invisible to it, so the controller sends any request pending locally for
// longer than report_after() (half the warning time) through full negotiation.
//  - after KOLO_STALL_WARNING_SECONDS: logs one warning listing each waiting
//    tensor, its op, the ranks that submitted it and the ranks missing
//    (repeated at most once per warning period while the stall lasts);
//  - after KOLO_STALL_SHUTDOWN_SECONDS (> 0): returns a verdict per tensor,
//    which rank 0 ships in the next negotiation, so every rank fails its
//    handle for it with RuntimeFault at the same point (controller.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/p2p.h"
#include "engine/message.h"
#include "log.h"

namespace kolo {
class Communicator;
}

namespace kolo::detail {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    double warning_seconds = 30;
    double shutdown_seconds = 300;  // 0 = never fail
    int process_set = 0;
    std::vector<int> world_ranks;  // of the set, for messages
  };
  struct Waiting {
    std::string name;
    RequestKind kind = RequestKind::kAllreduce;
    Clock::time_point since;     // entered rank 0's table
    std::vector<int> submitted;  // set ranks
    std::vector<int> missing;    // set ranks
  };

  StallInspector(Options options, Logger logger);

  // Requests that have waited this long are old enough to look at.
  Clock::duration warning_after() const { return warning_; }
  // Local requests pending this long in the cached path are sent through full
  // negotiation so that rank 0 can see them.
  Clock::duration report_after() const { return warning_ / 2; }

  // `stalled`: the waiting requests older than warning_after(), oldest first.
  // Logs the warning when due; returns the verdicts for requests older than
  // the shutdown time (the caller must not pass a request again once it got a
  // verdict).
  std::vector<StallVerdict> inspect(const std::vector<Waiting>& stalled, Clock::time_point now);

  // "ranks 1, 3" in world ranks.
  std::string ranks_text(const std::vector<int>& set_ranks) const;

 private:
  Options options_;
  Logger logger_;
  Clock::duration warning_;
  Clock::duration shutdown_;
  Clock::time_point last_warning_{};
  bool warned_ = false;
};

// The thread of a watch: calls check(now) with `mutex` held a few times per
// `warning` period (so a warning comes within about a quarter of it late),
// until destroyed. Its owner declares it last, so that it starts after and
// stops before everything check() reads.
class WatchThread {
 public:
  using Clock = std::chrono::steady_clock;
  WatchThread(std::mutex& mutex, Clock::duration warning,
              std::function<void(Clock::time_point)> check);
  ~WatchThread();  // stops and joins the thread
  WatchThread(const WatchThread&) = delete;
  WatchThread& operator=(const WatchThread&) = delete;

 private:
  std::mutex& mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// NegotiationWatch: watches the engine thread's negotiation from a thread of
// its own. The StallInspector runs inside negotiation, so it never sees a
// rank that does not arrive at all: a frozen process (SIGSTOP, a debugger),
// or an engine thread blocked elsewhere (e.g. in a completion callback),
// holds every other rank in the negotiation's first allreduce until the
// communicator's timeout (KOLO_TIMEOUT_SECONDS).
//  - after KOLO_STALL_WARNING_SECONDS in one negotiation, a warning names the
//    ranks the communicator still waits for (Communicator::waiting_for); the
//    lowest rank that is not missing logs it (every rank when the backend
//    cannot tell, mpi); repeated each warning period;
//  - after KOLO_STALL_SHUTDOWN_SECONDS (> 0) it aborts the communicator
//    (Communicator::abort): the negotiation throws RuntimeFault naming those
//    ranks, and the engine fails every pending request with it. Every rank
//    waiting does so at about the same time; shm and gloo also fail their
//    peers at once.
// A rank busy in a long collective of a process set it belongs to also holds
// the others' negotiation; the warning says so.
class NegotiationWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    double warning_seconds = 30;
    double shutdown_seconds = 300;  // 0 = never abort (the communicator's timeout applies)
    // Called after an abort (EngineOptions::on_stall_abort).
    std::function<void(const std::string& reason, const std::vector<int>& ranks)> on_abort;
  };

  NegotiationWatch(Options options, Logger logger);
  ~NegotiationWatch();  // stops and joins the thread
  NegotiationWatch(const NegotiationWatch&) = delete;
  NegotiationWatch& operator=(const NegotiationWatch&) = delete;

  // Engine thread, around one negotiation on `comm` (a process set whose
  // world ranks are `world_ranks`, this rank being `set_rank`). Cheap: a lock
  // and a clock read. `comm` and `world_ranks` must stay valid until leave().
  void enter(Communicator* comm, const std::vector<int>* world_ranks, int set_rank,
             int process_set);
  void leave();

 private:
  // Under mutex_: warns and aborts when due.
  void check(Clock::time_point now);
  std::string ranks_text(const std::vector<int>& set_ranks) const;

  Options options_;
  Logger logger_;
  Clock::duration warning_;
  Clock::duration shutdown_;
  std::mutex mutex_;
  // The negotiation in progress (comm_ null: none).
  Communicator* comm_ = nullptr;
  const std::vector<int>* world_ranks_ = nullptr;
  int set_rank_ = 0;
  int process_set_ = 0;
  Clock::time_point since_{};
  Clock::time_point last_warning_{};
  bool warned_ = false;
  bool aborted_ = false;
  WatchThread thread_;
};

// P2PWatch: watches the blocking point-to-point waits (P2PHandle::wait) on
// one communicator (comm/watched_communicator.h puts it around the
// communicators the Runtime hands out):
//  - after KOLO_STALL_WARNING_SECONDS in one wait, a warning names the
//    transfer by peer and tag ("recv from rank 1 (tag 101)"), repeated each
//    warning period; both sides of a deadlock (each waiting for the other)
//    warn, each naming its own wait;
//  - after KOLO_STALL_SHUTDOWN_SECONDS (> 0) it aborts the communicator,
//    blaming the peer: the wait throws RuntimeFault naming it, the peer's
//    transfers with this rank fail at once, and the communicator is unusable
//    (as after a TimeoutError). 0 = warnings only (the transfer's timeout,
//    KOLO_TIMEOUT_SECONDS, still applies);
//  - a transfer given its own timeout (P2POptions::timeout) longer than the
//    shutdown period (the warning period when there is none) is left to that
//    timeout, neither warned about nor aborted: its caller said it may wait
//    that long (a parameter server waiting up to PsOptions::idle_timeout for
//    a worker's next request);
//  - ranks are named as the communicator's, with their world rank beside
//    them when the communicator is a group ("rank 1 (world rank 3)").
class P2PWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    double warning_seconds = 30;
    double shutdown_seconds = 300;  // 0 = never abort
    // The world rank of each of the communicator's ranks; empty = the
    // communicator is the world.
    std::vector<int> world_ranks;
  };

  P2PWatch(Communicator* comm, Options options, Logger logger);
  P2PWatch(const P2PWatch&) = delete;
  P2PWatch& operator=(const P2PWatch&) = delete;

  // Around one wait of a transfer with `peer` (a rank of the communicator);
  // thread-safe, cheap (a lock and a clock read). enter() returns the id
  // that leave() takes.
  // `timeout`: the transfer's own (P2POptions::timeout; 0 = the default).
  uint64_t enter(P2PKind kind, int peer, int tag, std::chrono::milliseconds timeout);
  void leave(uint64_t id);
  // The communicator is going away: no more aborts (a handle may outlive it).
  void detach();

 private:
  struct Wait {
    P2PKind kind = P2PKind::kRecv;
    int peer = 0;
    int tag = 0;
    Clock::time_point since{};
    Clock::time_point last_warning{};
    bool warned = false;
    bool exempt = false;  // its own timeout is longer than the watch's period
  };
  // "rank 1", or "rank 1 (world rank 3)" on a group.
  std::string name_of(int rank) const;
  // Under mutex_: warns and aborts when due.
  void check(Clock::time_point now);

  Options options_;
  Logger logger_;
  Clock::duration warning_;
  Clock::duration shutdown_;
  std::mutex mutex_;
  Communicator* comm_;  // null once detached
  int rank_;
  std::map<uint64_t, Wait> waits_;
  uint64_t next_id_ = 0;
  bool aborted_ = false;
  WatchThread thread_;
};

}  // namespace kolo::detail
