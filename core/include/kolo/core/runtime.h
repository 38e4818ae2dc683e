// The kolo runtime: init, placement queries, the world communicator.
//
// A Runtime is an explicit object: it owns the configuration, the topology,
// the rendezvous store and the world communicator (and, later, the engine).
// Tests build as many as they like (ranks as threads). The free functions
// (kolo::init, kolo::rank, ...) act on one process-wide default Runtime, the
// Horovod-style entry point for programs; that default instance is the only
// process-level state in kolo.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/engine.h"
#include "kolo/core/store.h"
#include "kolo/core/topology.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct InitOptions {
  // Overrides KOLO_BACKEND: "auto", "shm", "gloo", "mpi". Auto: mpi when started
  // by mpirun/srun with MPI compiled in, shm when every rank is on this host,
  // gloo otherwise.
  std::optional<std::string> backend;
  // Overrides KOLO_TIMEOUT_SECONDS (default per collective and for rendezvous).
  std::optional<std::chrono::milliseconds> timeout;
  // Environment to read (tests inject one); defaults to the process environment.
  EnvLookup env;
  // Store prefix this runtime works under. Default: "kolo/init<g>" with g
  // counted per rank in the store (see runtime.cc). Elastic rounds set
  // "elastic/round<g>/init": their ranks are numbered afresh in every round,
  // so a per-rank counter would disagree between old and new workers.
  std::optional<std::string> store_prefix;
  // A connected store to rendezvous through instead of connecting to
  // KOLO_STORE_ADDR / MASTER_ADDR (store_prefix, or else the "kolo/init<g>"
  // default, still applies). Elastic rounds pass one whose waits give up when
  // kolorun declares the round failed (core/src/elastic/round_store.h);
  // kolo::init_torch() passes a client of the launcher's c10d TCPStore.
  std::shared_ptr<Store> store;
  // Passed to every communicator this runtime builds (the world's and,
  // later, the engine's): see CommunicatorOptions::rendezvous_check.
  std::function<void()> rendezvous_check;
};

// An engine's communicators: the one its thread runs on, and the factory of
// its process sets' (Engine's constructor arguments).
struct EngineCommunicators {
  std::unique_ptr<Communicator> world;
  CommunicatorFactory factory;
};

class Runtime {
 public:
  // Bootstraps: reads config, detects the topology, connects the store, builds
  // the world communicator. Throws ContractError / RuntimeFault.
  explicit Runtime(const InitOptions& options = {});
  // Ranks as threads: wraps an existing communicator (no store, no env).
  // `engine_comm` (a second communicator of the same ranks, used only by the
  // engine's thread) and `engine_factory` (process-set communicators) enable
  // engine(); without engine_comm, engine() is a ContractError.
  Runtime(std::unique_ptr<Communicator> world, Config config,
          std::unique_ptr<Communicator> engine_comm = nullptr,
          CommunicatorFactory engine_factory = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Topology& topology() const { return topology_; }
  const Config& config() const { return config_; }
  // ContractError on a worker that rejoined a running parameter-server job
  // (KOLO_PS_REJOIN): it has no world (the others built theirs without it).
  Communicator& world();
  // Null for ranks-as-threads runtimes and for mpi without a store.
  const std::shared_ptr<Store>& store() const { return store_; }

  // The engine (engine.h), created on first use by any thread (every rank
  // must use it: creating it is collective). It runs on its own communicator,
  // built like world()'s (same backend, store prefix "<world prefix>/engine",
  // no per-call argument checks: the engine validates requests itself), so
  // world() stays the caller's alone; process-set communicators are built the
  // same way under "<world prefix>/engine/set<id>". Settings come from
  // config() (KOLO_CYCLE_TIME_MS ...). Destroyed before the world communicator.
  Engine& engine();
  // The engine was created and has stopped (Engine::stopped): this runtime
  // can run no more collectives and must be shut down. False before engine().
  bool engine_stopped();

  // In-process replicas (replica_group.h): the engine communicators of this
  // process's replica `replica` in a world of size() * replicas members, in
  // which it is member rank() * replicas + replica. Built like the engine's
  // (same backend and options; members on one host share memory, hosts are
  // composed hierarchically as the world is) under `prefix`, which
  // next_replica_prefix() hands out. Collective: every replica of every rank
  // calls it at the same time, each from its own thread. ContractError for
  // ranks-as-threads runtimes and for mpi (whose members are processes).
  EngineCommunicators replica_communicators(const std::string& prefix, int replicas, int replica);
  // "<world prefix>/replicas<g>", g counted in this process: every rank
  // builds its replica groups in the same order, so the ranks agree.
  std::string next_replica_prefix();

  // A communicator of some of the world's ranks (`ranks`: sorted world
  // ranks, this one among them; its rank in the result is its index there),
  // built like world()'s (same backend and store) under the store prefix
  // "<world prefix>/<name>". Every member calls it with the same arguments;
  // names must differ between groups. For callers that need channels of
  // their own beside the engine (the parameter server's links). A
  // ranks-as-threads runtime has no backend to build with: ContractError.
  std::unique_ptr<Communicator> group_communicator(const std::vector<int>& ranks,
                                                   const std::string& name);

  // Asks the launcher to stop rank `rank` in its `start`-th restart (0: its
  // first start), which this rank found frozen (a parameter server whose
  // pulls wait for a worker that sends nothing): kolorun kills it and, with
  // --restart-workers, starts it again. `why` ends kolorun's report of it.
  // False, asking nothing, when the launcher is not kolorun; a RuntimeFault
  // when its store cannot be reached.
  bool request_eviction(int rank, int64_t start, const std::string& why);

 private:
  // The engine's communicator built from `base` and its process-set
  // factory (for the member of world rank `world_rank`); `world_check`, when
  // given and `base` has no rendezvous_check, checks the world's rendezvous
  // only (exit_check_).
  static EngineCommunicators engine_communicators(const std::string& backend,
                                                  const CommunicatorOptions& base, int world_rank,
                                                  std::function<void()> world_check = {});
  // `options` with exit_check_ as its rendezvous_check when it has none.
  CommunicatorOptions with_exit_check(CommunicatorOptions options) const;
  // Why world() and engine() are refused on a rejoined rank.
  std::string no_world(const std::string& call) const;
  // The options of a communicator of `ranks` (sorted world ranks) derived
  // from `base` under `prefix`: the engine's process sets and
  // group_communicator() build theirs the same way.
  static CommunicatorOptions group_options(const CommunicatorOptions& base,
                                           const std::vector<int>& ranks, int world_rank,
                                           const std::string& prefix, const std::string& what);

  Config config_;
  Topology topology_;
  std::unique_ptr<TcpStoreServer> store_server_;  // torchrun-style rank 0 only
  std::shared_ptr<Store> store_;
  std::unique_ptr<Communicator> world_;
  // Everything needed to build the engine's communicators.
  std::string backend_;
  CommunicatorOptions world_options_;
  // Under kolorun: fails a rendezvous of the whole world at once when a rank
  // already exited 0 (core/src/exit_notices.h); empty otherwise. Not for
  // process sets, which a finished rank outside them may have left.
  std::function<void()> exit_check_;
  // Under kolorun: its store at the root, where its notices live
  // (exit_notices.h); null otherwise.
  std::shared_ptr<Store> launcher_store_;
  std::unique_ptr<Communicator> engine_comm_;  // ranks as threads: handed in
  CommunicatorFactory engine_factory_;         // ranks as threads: handed in
  std::mutex engine_mutex_;                    // engine_ and replica_groups_
  int replica_groups_ = 0;                     // next_replica_prefix()'s counter
  std::unique_ptr<Engine> engine_;             // declared last: destroyed first
};

// Process-wide default runtime (Horovod-style API). init() twice without
// shutdown() is a ContractError; everything below before init() is a
// ContractError saying to call kolo::init() first.
void init(const InitOptions& options = {});
void shutdown();
bool is_initialized();
Runtime& runtime();
// runtime() for a frontend's call: before init() its ContractError names
// `operation` (e.g. "kolo::allreduce"), the function the user called.
Runtime& runtime_for(const std::string& operation);
int rank();
int size();
int local_rank();
int local_size();
int cross_rank();
int cross_size();
// Every host runs the same number of ranks (Topology::homogeneous).
bool is_homogeneous();

}  // namespace kolo
#pragma GCC visibility pop
