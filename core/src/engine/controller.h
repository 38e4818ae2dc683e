// The controller (internal): negotiates, once per engine cycle and per process
// set, which requests every rank of the set has submitted, and turns them into
// the same ordered list of Responses on every rank.
//
// ## Protocol (decentralised: no coordinator rank; every rank computes the same)
//
// Every rank of the set runs negotiate() once per cycle, in lockstep (the
// collectives below pair up the ranks' cycles). A rank's pending requests are
// each in one of three local states: CACHED (the response cache holds a
// response for its name and this rank's request is identical to the one it
// sent for it last time), TO_SEND (new to the others) or SENT (in everyone's
// message table, waiting for the other ranks).
//
// 1. Bit vector, ONE allreduce (u8, MIN), length 3 + cache slot_count():
//      [0] 1 = "I have nothing to send"       (MIN = 0: someone has: full round)
//      [1] 1 = "I am not shutting down"       (MIN = 0: every engine stops now)
//      [2] 1 = "I have nothing pending"       (MIN = 1: the world is idle; set 0
//              counts the rank's requests in every set)
//      [3 + c] 1 = "I have a CACHED request for cache slot c"
//    MIN acts as AND on the slot bits and, on the inverted flags, as OR.
//    Because every rank's cache holds the same names in the same slots (see
//    response_cache.h), a slot whose bit survives is ready on every rank: its
//    cached response is executed without any further exchange. This is the
//    steady state of training: one small allreduce per cycle.
// 2. Full round, only when flag [0] says some rank has something to send:
//    allgather of each rank's serialized RequestList size (i64), then
//    allgatherv of the lists. Every rank then applies the same lists in rank
//    order to its copy of the message table (name -> which ranks submitted
//    what, plus a global arrival number):
//      a. stall verdicts shipped by set rank 0 (below) fail their entries;
//      b. autotuned parameters shipped by rank 0 (set 0) are adopted;
//      c. JOIN marks the rank joined (the latest joiner, highest rank on ties,
//         is remembered); other requests enter the table. A name that enters
//         the table is erased from the response cache on every rank, and a
//         rank holding a CACHED request of that name moves it to TO_SEND, so
//         the two paths never split one name.
//    An entry is ready when every rank of the set has submitted it or has
//    joined. Ready entries, in arrival order, are validated (kind, dtype,
//    shape - all but dim 0 for allgather/alltoall -, op, root, prescale,
//    postscale; a mismatch yields an error response naming the tensor, the op,
//    the ranks and their values, failed on every rank) and leave the table;
//    successful ones that all ranks contributed are put in the response cache
//    (LRU eviction; a rank's CACHED request whose entry is evicted moves to
//    TO_SEND). When every rank has joined, the join finishes on every rank.
// 3. Responses of the cycle, identical everywhere: cache hits in slot order,
//    then stall failures, then table entries in arrival order.
//
// The cache is used only while no rank of the set has joined (joined ranks
// contribute neutral data, so their responses depend on who joined). A rank
// sending its JOIN sends its CACHED requests in the same list, ahead of it, so
// that no entry can count it as joined while its own request sits in the
// cached path.
//
// Stalls: set rank 0 runs the StallInspector over its table every cycle. A
// request waiting in the CACHED path is invisible there, so a rank sends any
// CACHED request older than half the warning time through a full round. After
// the shutdown time, rank 0 ships a verdict in the next full round (it raises
// flag [0] to force one) and every rank fails the entry at the same point.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/message.h"
#include "engine/response_cache.h"
#include "engine/stall_inspector.h"
#include "kolo/core/communicator.h"
#include "log.h"

namespace kolo::detail {

// Name of the join request (Engine::join) in negotiation and stall verdicts;
// user names starting with "__kolo/" are reserved.
constexpr const char* kJoinName = "__kolo/join";

struct ControllerOptions {
  int process_set = 0;
  std::vector<int> world_ranks;  // members, sorted; the index is the set rank
  int set_rank = 0;
  int cache_capacity = 1024;
  double stall_warning_seconds = 30;
  double stall_shutdown_seconds = 300;
};

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  // `comm` is the set's communicator (size = world_ranks.size()); it must
  // outlive the controller and is used only inside negotiate().
  Controller(Communicator& comm, ControllerOptions options, Logger logger);

  int set_size() const { return static_cast<int>(options_.world_ranks.size()); }
  int set_rank() const { return options_.set_rank; }

  // A request of this rank enters negotiation. Its name must not be pending.
  // `info` is referenced, not copied: it must stay alive and unchanged until
  // the request leaves negotiation (a response for it, or the controller's end).
  // `owner` is the caller's handle on the request, handed back with its
  // response (Outcome::owners) so the caller needs no lookup by name.
  // `cache_slot_hint` (optional) is where the name was found in the response
  // cache last time; it is checked, used, and updated, which saves the
  // cache's lookup by name when the caller keeps it per name.
  void submit(const RequestInfo& info, void* owner, Clock::time_point now,
              int* cache_slot_hint = nullptr);
  // Set rank 0 of set 0: ship these parameters in the next round.
  void ship_params(double cycle_time_ms, int64_t fusion_threshold_bytes);

  struct Outcome {
    std::vector<ResponsePtr> responses;  // execution order, identical on every rank
    // Per response: the `owner` this rank submitted it with, or null (this
    // rank has no request in it: it joined, or a stall verdict for others).
    std::vector<void*> owners;
    bool shutdown = false;  // some rank is shutting down: stop now
    bool idle = false;      // no rank has anything pending in any set
    bool full_round = false;
    bool has_params = false;
    double cycle_time_ms = 0;
    int64_t fusion_threshold_bytes = 0;
    bool join_finished = false;  // every rank joined; this rank's join completes
    int last_joined = -1;        // world rank
    uint64_t cache_hits = 0;
    uint64_t cache_evictions = 0;
  };
  // One negotiation round (collective on the set's communicator). Throws the
  // communicator's RuntimeFault / TimeoutError. `busy_elsewhere`: this rank
  // has requests pending outside this controller (other process sets), so it
  // must not count as idle (Outcome::idle lets idle engines stop cycling).
  Outcome negotiate(bool shutting_down, bool busy_elsewhere = false);

  bool any_joined() const { return joined_count_ > 0; }

 private:
  enum class LocalStatus : uint8_t { kToSend, kCached, kSent };
  // One pending request of this rank. Found without a lookup by name: through
  // its cache slot while CACHED (by_slot_), through its table entry once SENT
  // (Entry::mine), through join_ for the join.
  struct Local {
    const RequestInfo* info = nullptr;  // owned by the engine's pending request
    void* owner = nullptr;
    Clock::time_point since;
    uint64_t order = 0;  // local submission number
    LocalStatus status = LocalStatus::kToSend;
    int slot = -1;
    Local* prev = nullptr;  // in the list of pending locals
    Local* next = nullptr;
  };
  struct Entry {
    uint64_t seq = 0;
    Clock::time_point since;
    std::vector<RequestInfo> infos;  // per set rank; valid where present
    std::vector<uint8_t> present;
    int count = 0;
    Local* mine = nullptr;  // this rank's request, when present
  };

  bool cache_usable() const { return cache_.capacity() > 0 && joined_count_ == 0; }
  void classify(Local& local, int* cache_slot_hint = nullptr);
  // CACHED -> TO_SEND.
  void to_send(Local& local);
  // The CACHED local of `name`, if any, goes TO_SEND. Call while `name` is
  // still in the cache.
  void uncache_local(const std::string& name);
  // Unlinks and frees `local`; returns its owner.
  void* remove(Local* local);
  void full_round(Outcome& out, Clock::time_point now);
  void apply_verdict(const StallVerdict& verdict, Outcome& out);
  void collect_ready(Outcome& out);
  Response make_response(const std::string& name, const Entry& entry) const;
  void inspect_stalls(Clock::time_point now);
  std::string world_rank_text(int set_rank) const;

  Communicator& comm_;
  ControllerOptions options_;
  Logger logger_;
  ResponseCache cache_;
  std::unique_ptr<StallInspector> inspector_;  // set rank 0 only

  // Pending locals (a list: the hot path walks them all and removes any one),
  // their storage and free list.
  Local* head_ = nullptr;
  size_t local_count_ = 0;
  std::vector<std::unique_ptr<Local>> storage_;
  std::vector<Local*> free_locals_;
  std::vector<Local*> by_slot_;  // cache slot -> the CACHED local on it, or null
  Local* join_ = nullptr;        // this rank's pending join
  uint64_t local_order_ = 0;

  std::unordered_map<std::string, Entry> table_;
  std::map<uint64_t, std::string> arrival_;  // seq -> name
  uint64_t next_seq_ = 0;

  std::vector<uint8_t> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;  // set rank
  Clock::time_point first_join_{};

  // Set rank 0: to ship in the next round.
  std::vector<StallVerdict> verdicts_;
  std::map<std::string, bool> verdicted_;  // names with a verdict not yet applied
  bool params_pending_ = false;
  double params_cycle_time_ms_ = 0;
  int64_t params_fusion_threshold_bytes_ = 0;

  std::vector<uint8_t> bits_;        // reused bit vector
  std::vector<int64_t> list_sizes_;  // reused
  std::string gathered_;             // reused
};

}  // namespace kolo::detail
