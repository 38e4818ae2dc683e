// The parameter server's protocol on a link (kolo/core/parameter_server.h
// builds the links, kolo/torch/parameter_server.h drives them): the messages
// and their checks, and the clocks that decide when a server may answer a
// pull (synchronous, asynchronous, bounded staleness) and which workers a
// waiting pull is held back by. Internal to the libtorch frontend.
//
// Messages on a link (tags below). A request is a header of kHeaderWords
// int64 (kind, clock, element count, fingerprint, value, status); a push
// follows with its data, a pull is answered with a header and the data.
// Every header is checked (Header::decode) before anything it announces is
// received.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/torch/parameter_server.h"

namespace kolo::ps {

// ---- messages ----

constexpr int kHeaderWords = 6;
constexpr int kRequestTag = 0;  // worker -> server: request header
constexpr int kPushTag = 1;     // worker -> server: a push's gradient
constexpr int kReplyTag = 2;    // server -> worker: reply header
constexpr int kParamsTag = 3;   // server -> worker: a pull's parameters

enum class Kind : int64_t {
  // value = mode | max_staleness << 8; clock = the worker's restart
  // generation (0: first start); answered by a kReply whose clock is the
  // step to continue from.
  kHello = 1,
  kPull = 2,   // clock = the step the worker is about to run
  kPush = 3,   // clock = the step whose gradient follows; count = elements
  kDone = 4,   // the worker leaves; no reply
  kReply = 5,  // value = the server's slowest live clock when answered (pull)
  // Rows of an embedding table (kolo/torch/ps_embedding.h): value = the
  // table's index on the server, fingerprint = its spec's, count = rows; the
  // row ids (int64, local to the server's range) follow on kPushTag.
  // clock = the step about to run; answered by a kReply and the rows. With
  // count 0, a greeting: the reply's status says whether the table is there.
  kSparsePull = 6,
  kSparsePush = 7,  // clock = the step whose row gradients follow (before its kPush)
  // A restarted worker's clock after its hello (clock = the step it
  // continues from, the largest of the servers' answers); no reply.
  kRejoin = 8,
};

struct Header {
  Kind kind = Kind::kPull;
  int64_t clock = 0;
  int64_t count = 0;
  int64_t fingerprint = 0;
  int64_t value = 0;
  // 0 = ok; otherwise the request was refused (the server then aborts the link).
  int64_t status = 0;

  std::vector<int64_t> encode() const;
  // Throws ContractError naming `source` for anything that is not a header
  // of a known kind with counts in range.
  static Header decode(const int64_t* words, const std::string& source);
};

// ---- the server's clocks ----

// One server's view of its workers: their clocks (steps pushed), which have
// left or died, the synchronous round, and the staleness of every update.
// Not thread-safe: the frontend holds its lock around every call.
class ServerClocks {
 public:
  ServerClocks(int workers, Mode mode, int max_staleness);

  // A pull for step `clock` may be answered now: sync: round `clock` has
  // been applied (every live worker pushed steps < clock); ssp: every live
  // worker has pushed at least clock - max_staleness steps; async: always.
  bool may_serve_pull(int64_t clock) const;
  // Records that `worker` read the parameters for step `clock` now; returns
  // the staleness it reads with (its clock minus the slowest live worker's).
  int64_t served_pull(int worker, int64_t clock);
  // Records `worker`'s push of step `clock`. ContractError if it is not the
  // next step of that worker (a protocol violation). Returns round_complete().
  bool pushed(int worker, int64_t clock);
  // Sync: the current round has pushes and every live worker has pushed its
  // step (a worker that left after pushing it still counts in the average;
  // a live one that has not pushed yet is still waited for).
  bool round_complete() const;
  // The sync round was applied (after pushed() returned true).
  void round_applied();
  // The live workers that a pull for step `clock` waits for: sync, those that
  // have not pushed step clock - 1; ssp, those more than max_staleness + 1
  // steps behind; empty when may_serve_pull(clock).
  std::vector<int> holding_back(int64_t clock) const;
  // The worker left (kDone) or its link failed; it no longer holds anyone back.
  void left(int worker);
  // The step a restarted `worker` should continue from: the slowest live
  // worker's (so ssp's bound holds at once), or its own when none is live.
  int64_t rejoin_clock(int worker) const;
  // A worker that left comes back and continues from step `clock`.
  void rejoined(int worker, int64_t clock);
  // A resumed server checkpoint saved at step `step`: every worker continues
  // from it (pushed `step` steps), and sync rounds restart at `step`.
  void resume(int64_t step);

  int64_t slowest_live_clock() const;  // INT64_MAX when none is live
  int64_t rounds_applied() const { return rounds_; }
  int live_workers() const;
  bool all_left() const { return live_workers() == 0; }
  // Pushes of the current round received so far (sync).
  int round_pushes() const { return round_pushes_; }
  // The step `worker` pushes next (the steps it has pushed).
  int64_t next_step(int worker) const { return clocks_[worker]; }

  const StalenessStats& stats() const { return stats_; }

 private:
  Mode mode_;
  int max_staleness_;
  std::vector<int64_t> clocks_;   // steps pushed, per worker
  std::vector<int64_t> read_at_;  // staleness of the worker's last pull
  std::vector<bool> live_;
  int64_t rounds_ = 0;  // sync rounds applied
  int round_pushes_ = 0;
  StalenessStats stats_;
};

}  // namespace kolo::ps
