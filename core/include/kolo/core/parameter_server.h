// The parameter server's shape, without tensors: roles, how variables are
// partitioned across servers, and the point-to-point links between servers
// and workers. The libtorch frontend (kolo/torch/parameter_server.h) holds
// the tensors and the optimizer, and speaks the protocol on these links (its
// messages and the servers' clocks are internal to it: torch/src/
// ps_protocol.h); docs/strategies.md says when to choose it.
//
// Roles. A job of W + S ranks: ranks [0, W) are workers, ranks [W, W + S) are
// servers (`kolorun -np W --servers S`, or `mpirun -np W+S` with
// KOLO_PS_SERVERS=S: the role follows from the rank, so every launcher works).
//
// Transport. Every (server, worker) pair has a communicator of its own, of
// two ranks (worker = rank 0, server = rank 1: world rank order), on the
// job's backend (shm, gloo, mpi; threads in tests) and its point-to-point transfers
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
// largest answer and tells every server, so all agree on its clock.
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
