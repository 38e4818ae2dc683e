// The parameter server's protocol, without tensors: roles, how variables are
// partitioned across servers, the messages and their checks, the clocks that
// decide when a pull may be served (synchronous, asynchronous, bounded
// staleness), and the point-to-point links between servers and workers. The
// libtorch frontend (kolo/torch/parameter_server.h) holds the tensors and the
// optimizer and drives this state; docs/strategies.md says when to choose it.
//
// Roles. A job of W + S ranks: ranks [0, W) are workers, ranks [W, W + S) are
// servers (`kolorun -np W --servers S`, or `mpirun -np W+S` with
// KOLO_PS_SERVERS=S: the role follows from the rank, so every launcher works).
//
// Transport. Every (server, worker) pair has a communicator of its own, of
// two ranks (worker = rank 0, server = rank 1: world rank order), on the job's backend (shm,
// gloo, mpi; threads in tests) and its point-to-point transfers
// (communicator.h): framing, bounds, matching of count and dtype and, through
// the rendezvous store, authentication come from there. One link per pair
// means a worker that dies breaks only its own link: the servers go on with
// the others (asynchronous modes).
//
// Rejoining (asynchronous modes; `kolorun --restart-workers N`). A worker
// that dies leaves: the servers go on with the others. kolorun restarts it
// with KOLO_PS_REJOIN=g (its g-th restart); its kolo::init() builds no world
// communicator, and connect() announces it in the store, waits until every
// server accepts (or has ended: a RuntimeFault), and builds new links named
// for generation g. Its hello says it rejoins; each server answers the step
// it would continue from (the slowest live worker's), the worker takes the
// largest answer and tells every server (kRejoin), so all agree on its clock.
//
// Messages on a link (tags below). A request is a header of kHeaderWords
// int64 (kind, clock, element count, fingerprint, value); a push follows with
// its data, a pull is answered with a header and the data. Every header is
// checked (check_request) before anything it announces is received.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/dtype.h"
#include "kolo/core/topology.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {
class Runtime;
}

namespace kolo::ps {

// How servers apply pushes and when they answer pulls.
enum class Mode {
  // Servers average the pushes of every worker for step c, apply the
  // optimizer once, and answer pulls for step c + 1 after that: equals
  // data-parallel SGD (DistributedOptimizer) on the union of the batches.
  kSync,
  // Each push is applied when it arrives; pulls are answered at once.
  kAsync,
  // Stale-synchronous parallel: as kAsync, but a pull for step c waits until
  // every live worker has pushed step c - max_staleness - 1 (no worker runs
  // more than max_staleness steps ahead of the slowest).
  kSsp,
};
const char* mode_name(Mode mode);
// "sync", "async", "ssp"; ContractError naming `what` otherwise.
Mode parse_mode(const std::string& text, const std::string& what);

struct Roles {
  int workers = 1;
  int servers = 0;
  int rank = 0;  // world rank

  bool is_server() const { return rank >= workers; }
  int server_index() const { return rank - workers; }  // valid on a server
  int worker_index() const { return rank; }            // valid on a worker
  int server_rank(int server) const { return workers + server; }
};

// Roles from the topology and KOLO_PS_SERVERS: ContractError when there are
// no servers, or not at least one worker.
Roles roles_from(const Topology& topology, const Config& config);

// One variable as both sides see it. Dense variables are partitioned as flat
// element ranges (a large tensor is cut into slices across servers).
struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;

  int64_t numel() const;
};

// Elements [begin, end) of the flattened variable `variable` (an index into
// the spec list).
struct Slice {
  int variable = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t numel() const { return end - begin; }
};

// What each server holds: the variables laid end to end (in spec order) and
// cut into `servers` ranges of equal bytes (to the element), so that every
// server stores and moves the same share; slices[s] are server s's pieces in
// order. A server's shard is the concatenation of its slices.
struct Partition {
  std::vector<std::vector<Slice>> slices;
  std::vector<int64_t> shard_numel;  // per server

  static Partition by_bytes(const std::vector<VariableSpec>& specs, int servers);
};

// A hash of the names, shapes and dtypes (FNV-1a, 64 bit): a worker and a
// server whose models differ refuse each other with a ContractError.
int64_t fingerprint(const std::vector<VariableSpec>& specs);

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

  struct Stats {
    int64_t updates = 0;          // pushes applied (sync: pushes received)
    int64_t max_staleness = 0;    // largest staleness any update was computed at
    std::vector<int64_t> counts;  // counts[k]: updates computed at staleness k (last bin: more)
    std::vector<int64_t> worker_updates;  // per worker: its pushes received
    std::vector<int64_t> rejoins;         // per worker: times it came back after leaving
  };
  const Stats& stats() const { return stats_; }

 private:
  Mode mode_;
  int max_staleness_;
  std::vector<int64_t> clocks_;   // steps pushed, per worker
  std::vector<int64_t> read_at_;  // staleness of the worker's last pull
  std::vector<bool> live_;
  int64_t rounds_ = 0;  // sync rounds applied
  int round_pushes_ = 0;
  Stats stats_;
};

// ---- links ----

// This process's links: on a server, one per worker (index = worker); on a
// worker, one per server (index = server). Each is a two-rank communicator
// (worker = rank 0, server = rank 1; kWorkerPeer / kServerPeer).
constexpr int kWorkerPeer = 0;
constexpr int kServerPeer = 1;
// A server's side of rejoining, over the job's store and backend (connect()
// fills it; make_thread_links() leaves it null: a lost worker stays lost).
struct RejoinChannel {
  // The restart generation `worker` announced last (0: none). Never blocks.
  std::function<int64_t(int worker)> announced;
  // Accepts `worker`'s restart `generation` and builds the new link to it
  // (collective with that worker's connect(); the links' timeout bounds it).
  std::function<std::unique_ptr<Communicator>(int worker, int64_t generation)> accept;
  // This server has ended: a restarted worker that comes now is refused.
  std::function<void()> close;
  // Asks the launcher to stop `worker` in its restart `generation`, which
  // this server evicted for sending nothing while others waited for it
  // (Runtime::request_eviction; under kolorun it is killed and, with
  // --restart-workers, restarted). False when no launcher can be asked.
  std::function<bool(int worker, int64_t generation, const std::string& why)> evict;
};

struct Links {
  Roles roles;
  std::vector<std::unique_ptr<Communicator>> peers;
  // The links' default per-call timeout (KOLO_TIMEOUT_SECONDS; a timeout of
  // 0 in PsOptions means this).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // On a worker: its restart generation (KOLO_PS_REJOIN; 0: first start).
  int64_t generation = 0;
  // On a server built by connect(): how restarted workers reach it again.
  std::shared_ptr<RejoinChannel> rejoin;
};

struct LinkOptions {
  // Name of this set of links in the store (two parameter servers in one job
  // need different names).
  std::string name = "ps";
};

// Builds this rank's links through the runtime's backend and store (every
// rank of the job calls it: each pair builds its communicator). On a worker
// restarted with KOLO_PS_REJOIN, builds them with the running servers only
// (see "Rejoining" above): a RuntimeFault when a server has already ended,
// a TimeoutError when one does not answer within the runtime's timeout.
Links connect(Runtime& runtime, const Roles& roles, const LinkOptions& options = {});
// The same with roles_from(runtime's topology and config).
Links connect(Runtime& runtime, const LinkOptions& options = {});

// Ranks as threads: the links of every rank of a W + S job at once
// (result[r] for world rank r, as Roles numbers them).
std::vector<Links> make_thread_links(int workers, int servers,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(300));

}  // namespace kolo::ps
#pragma GCC visibility pop
