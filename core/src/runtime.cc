// Runtime bootstrap and the process-wide default runtime (runtime.h).
//
// Bootstrap order: config -> topology -> store (connect, or serve it on
// torchrun-style rank 0) -> placement (host names through the store when the
// launcher did not give it) -> backend choice -> world communicator ->
// placement through the communicator when there was no store (mpi).
//
// Store layout: every init of a process takes a generation number g from the
// counter "kolo/inits/<rank>" (all ranks init equally often, so they agree) and
// works under the prefix "kolo/init<g>": a second init() after shutdown() never
// sees the first one's keys.
#include "kolo/core/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/backends.h"
#include "comm/hierarchical_communicator.h"
#include "comm/watched_communicator.h"
#include "exit_notices.h"
#include "kolo/core/errors.h"
#include "log.h"

namespace kolo {
namespace {

// `comm` with its point-to-point waits watched for stalls (the settings of
// the engine's stall checks: KOLO_STALL_WARNING_SECONDS and
// KOLO_STALL_SHUTDOWN_SECONDS; comm/watched_communicator.h says why).
// `world_ranks`: a group's members (its warnings name them); empty = the world.
std::unique_ptr<Communicator> watched(std::unique_ptr<Communicator> comm, const Config& config,
                                      std::vector<int> world_ranks = {}) {
  detail::P2PWatch::Options options;
  options.warning_seconds = config.get_double("KOLO_STALL_WARNING_SECONDS");
  options.shutdown_seconds = config.get_double("KOLO_STALL_SHUTDOWN_SECONDS");
  options.world_ranks = std::move(world_ranks);
  const int rank = comm->rank();
  return std::make_unique<detail::WatchedCommunicator>(std::move(comm), options,
                                                       detail::Logger::from_config(config, rank));
}

using std::chrono::milliseconds;

// How long rank 0 keeps serving the store at shutdown for the other ranks to
// finish with it (at most the runtime timeout).
constexpr milliseconds kShutdownGrace{30000};

// Bytes per host name in the allgather of host names (mpi without a store).
constexpr size_t kHostNameBytes = 256;

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "ip6-localhost" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

std::string this_host_name(const Config& config) {
  if (config.is_set("KOLO_HOSTNAME")) return config.get_string("KOLO_HOSTNAME");
  char name[kHostNameBytes] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Host index of every rank (hosts numbered by their lowest rank), from each
// rank's host key.
std::vector<int> host_indices(const std::vector<std::string>& hosts) {
  std::map<std::string, int> index;
  std::vector<int> out;
  for (const auto& host : hosts) {
    out.push_back(index.emplace(host, static_cast<int>(index.size())).first->second);
  }
  return out;
}

// Fills local_* / cross_* of `t` from every rank's host name; hosts are
// numbered in the order of their lowest rank.
void place_by_host(const std::vector<std::string>& hosts, Topology& t) {
  std::map<std::string, int> host_index;
  for (const auto& host : hosts) host_index.emplace(host, static_cast<int>(host_index.size()));
  const std::string& mine = hosts[t.rank];
  t.cross_size = static_cast<int>(host_index.size());
  t.cross_rank = host_index[mine];
  t.local_rank = 0;
  t.local_size = 0;
  for (int r = 0; r < t.size; ++r) {
    if (hosts[r] != mine) continue;
    if (r < t.rank) ++t.local_rank;
    ++t.local_size;
  }
  t.placement_known = true;
}

std::string store_hint() {
  return "launch with kolorun, or set MASTER_ADDR and MASTER_PORT (rank 0 serves the store on "
         "that port), or KOLO_STORE_ADDR and KOLO_STORE_PORT (a store served elsewhere)";
}

}  // namespace

Runtime::Runtime(const InitOptions& options) {
  const EnvLookup env = options.env ? options.env : process_env();
  config_ = Config::load(env);
  topology_ = detect_topology(env, config_);
  const detail::Logger logger = detail::Logger::from_config(config_, topology_.rank);

  const milliseconds timeout =
      options.timeout ? *options.timeout
                      : milliseconds(static_cast<int64_t>(
                            config_.get_double("KOLO_TIMEOUT_SECONDS") * 1000.0 + 0.5));
  if (timeout.count() <= 0) {
    throw ContractError("kolo::init: InitOptions.timeout must be > 0 ms, got " +
                        std::to_string(timeout.count()));
  }
  std::string requested =
      options.backend ? lower(*options.backend) : config_.get_string("KOLO_BACKEND");
  if (requested != "auto" && requested != "shm" && requested != "gloo" && requested != "mpi") {
    throw ContractError("kolo::init: InitOptions.backend '" + *options.backend +
                        "' is not one of auto, shm, gloo, mpi");
  }

  // Rendezvous store: only a world of more than one needs it.
  std::shared_ptr<Store> raw_store;
  if (topology_.size > 1 && options.store) {
    raw_store = options.store;
  } else if (topology_.size > 1 && topology_.store_kind == "c10d") {
    throw ContractError(
        "kolo::init: the launcher serves a c10d TCPStore at " + topology_.store_host + ":" +
        std::to_string(topology_.store_port) +
        " (TORCHELASTIC_USE_AGENT_STORE=True or KOLO_STORE=c10d), which kolo joins through "
        "libtorch's client: call kolo::init_torch() (kolo/torch/c10d_store.h, link kolo::torch) "
        "instead of kolo::init(), or pass a store in InitOptions::store");
  } else if (topology_.size > 1 && !topology_.store_host.empty()) {
    std::string connect_host = topology_.store_host;
    if (topology_.serve_store) {
      TcpStoreServer::Options server;
      server.bind_address = is_loopback(topology_.store_host) ? "127.0.0.1" : "0.0.0.0";
      server.port = topology_.store_port;
      server.secret = config_.get_string("KOLO_JOB_SECRET");
      store_limits_from(config_, server);
      store_server_ = std::make_unique<TcpStoreServer>(server);
      connect_host = "127.0.0.1";
      logger.info("serving the rendezvous store on " + server.bind_address + ":" +
                  std::to_string(server.port));
    }
    raw_store = connect_tcp_store(connect_host, topology_.store_port, timeout,
                                  config_.get_string("KOLO_JOB_SECRET"));
  }
  if (raw_store && options.store_prefix) {
    store_ = make_prefix_store(raw_store, *options.store_prefix);
  } else if (raw_store) {
    // A rejoining worker (KOLO_PS_REJOIN) joins the world its first start
    // initialised in: the same generation, not a new one.
    const int64_t generation = raw_store->add("kolo/inits/" + std::to_string(topology_.rank),
                                              config_.get_int("KOLO_PS_REJOIN") > 0 ? 0 : 1);
    store_ = make_prefix_store(raw_store, "kolo/init" + std::to_string(generation));
  }

  // Placement through the store when the launcher did not give it; the
  // host of every rank is kept for the hierarchical composition.
  std::vector<int> rank_hosts;
  auto exchange_hosts = [&](const std::string& mine) {
    store_->set("host/" + std::to_string(topology_.rank), to_bytes(mine));
    std::vector<std::string> keys;
    for (int r = 0; r < topology_.size; ++r) keys.push_back("host/" + std::to_string(r));
    store_->wait(keys, timeout);
    std::vector<std::string> hosts;
    for (const auto& key : keys) hosts.push_back(to_string(store_->get(key, timeout)));
    rank_hosts = host_indices(hosts);
    return hosts;
  };
  if (!topology_.placement_known && store_) {
    place_by_host(exchange_hosts(this_host_name(config_)), topology_);
  }

  // Backend: explicit choice, else mpi under an MPI launcher, else shm on one
  // host, else gloo.
  std::string backend = requested;
  if (backend == "auto") {
    // An MPI launch: the environment carries OpenMPI's or PMI's rank variables,
    // or srun started the job and the MPI library recognises it. kolorun's own
    // workers are not MPI processes (`kolorun --backend mpi` runs mpirun, whose
    // workers show OpenMPI's variables and get KOLO_BACKEND=mpi); torchrun-style
    // and launcher-less processes are never MPI jobs.
    bool mpi_launch = false;
#if KOLO_HAVE_MPI
    mpi_launch = topology_.source == "openmpi" || topology_.source == "pmi" ||
                 (topology_.source == "slurm" && detail::launched_by_mpi());
#endif
    if (mpi_launch) {
      backend = "mpi";
    } else if (topology_.size == 1 || (topology_.placement_known && topology_.cross_size == 1)) {
      backend = "shm";
    } else if (!topology_.placement_known) {
      throw ContractError("kolo::init: " + std::to_string(topology_.size) + " ranks (from " +
                          topology_.source + ") but no rendezvous store to find each other; " +
                          store_hint());
    } else {
#if KOLO_HAVE_GLOO
      backend = "gloo";
#else
      throw ContractError("kolo::init: the ranks span " + std::to_string(topology_.cross_size) +
                          " hosts, which needs the gloo or mpi backend, and this build has "
                          "neither gloo nor an MPI launch; start the job with mpirun or install "
                          "libgloo-dev and rebuild");
#endif
    }
  }
  if (backend != "mpi" && topology_.size > 1 && !store_) {
    throw ContractError("kolo::init: backend '" + backend + "' needs a rendezvous store for " +
                        std::to_string(topology_.size) + " ranks (from " + topology_.source +
                        "), but none was given; " + store_hint() +
                        "; or start the job with mpirun and the mpi backend");
  }
  if (backend == "shm" && topology_.placement_known && topology_.cross_size > 1) {
    throw ContractError("kolo::init: backend 'shm' needs every rank on one host, but the " +
                        std::to_string(topology_.size) + " ranks span " +
                        std::to_string(topology_.cross_size) +
                        " hosts; use KOLO_BACKEND=gloo or mpi (or auto)");
  }

  // The launcher placed the ranks: every rank's host index through the
  // store, when a hierarchical world is possible.
  if (rank_hosts.empty() && store_ && (backend == "gloo" || backend == "mpi") &&
      topology_.cross_size > 1 && config_.get_string("KOLO_HIERARCHICAL") != "off") {
    exchange_hosts("cross:" + std::to_string(topology_.cross_rank));
  }

  CommunicatorOptions comm;
  comm.rank = topology_.rank;
  comm.size = topology_.size;
  comm.store = store_;
  comm.prefix = "world/0";
  comm.timeout = timeout;
  comm.check_args = config_.get_bool("KOLO_CHECK_ARGS");
  comm.rendezvous_check = options.rendezvous_check;
  comm.shm_spin_us = static_cast<int>(config_.get_int("KOLO_SHM_SPIN_US"));
  comm.shm_chunk_bytes = config_.get_int("KOLO_SHM_CHUNK_BYTES");
  comm.gloo_iface = config_.get_string("KOLO_GLOO_IFACE");
  comm.host_name = this_host_name(config_);
  comm.hierarchical = config_.get_string("KOLO_HIERARCHICAL");
  comm.rank_hosts = rank_hosts;
  backend_ = backend;
  world_options_ = comm;
  if (topology_.source == "kolorun" && raw_store && topology_.size > 1) {
    // kolorun writes its notices at the root of its store, outside any
    // generation's prefix.
    exit_check_ = detail::exited_ranks_check(raw_store, topology_.rank, topology_.size);
    launcher_store_ = raw_store;
  }
  if (config_.get_int("KOLO_PS_REJOIN") > 0) {
    // A worker restarted into a running parameter-server job (kolorun
    // --restart-workers): the others built the world long ago and will not
    // do it again, so this rank has none; kolo::ps::connect() builds its
    // links to the servers through the store (group_communicator()).
    if (topology_.size < 2 || !store_ || backend == "mpi") {
      throw ContractError(
          "kolo::init: KOLO_PS_REJOIN is set (a worker restarted by kolorun --restart-workers), "
          "which needs a job of several ranks with kolorun's rendezvous store and the shm or "
          "gloo backend; do not set it yourself");
    }
    logger.info("rank " + std::to_string(topology_.rank) + " of " + std::to_string(topology_.size) +
                " rejoins a running parameter-server job "
                "(restart " +
                std::to_string(config_.get_int("KOLO_PS_REJOIN")) + "), backend " + backend +
                ", without a world communicator");
    return;
  }
  world_ = watched(make_communicator(backend, with_exit_check(comm)), config_);
  if (world_->rank() != topology_.rank || world_->size() != topology_.size) {
    throw ContractError("kolo::init: backend '" + backend + "' reports rank " +
                        std::to_string(world_->rank()) + " of " + std::to_string(world_->size()) +
                        ", but the launcher (" + topology_.source + ") says rank " +
                        std::to_string(topology_.rank) + " of " + std::to_string(topology_.size) +
                        "; start the program with the launcher that matches the backend");
  }

  // Placement through the communicator (mpi without a store).
  if (!topology_.placement_known) {
    std::string mine = this_host_name(config_);
    mine.resize(kHostNameBytes, '\0');
    std::string all(kHostNameBytes * topology_.size, '\0');
    world_->allgather(mine.data(), all.data(), kHostNameBytes, DType::kU8, CollectiveOptions{});
    std::vector<std::string> hosts;
    for (int r = 0; r < topology_.size; ++r) {
      hosts.push_back(std::string(all.c_str() + r * kHostNameBytes));
    }
    place_by_host(hosts, topology_);
    // Now that every rank's host is known, the world may be hierarchical.
    comm.rank_hosts = host_indices(hosts);
    if (detail::wants_hierarchy(comm)) {
      world_.reset();
      world_ = watched(make_communicator(backend, with_exit_check(comm)), config_);
    }
    world_options_ = comm;
  }
  // Homogeneous: the largest local_size equals the smallest (max of both
  // signs in one allreduce).
  if (topology_.size > 1) {
    int32_t extremes[2] = {topology_.local_size, -topology_.local_size};
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    world_->allreduce(extremes, extremes, 2, DType::kI32, max);
    topology_.homogeneous = extremes[0] == -extremes[1];
  }
  logger.info("initialised rank " + std::to_string(topology_.rank) + " of " +
              std::to_string(topology_.size) + " (local " + std::to_string(topology_.local_rank) +
              "/" + std::to_string(topology_.local_size) + ", host " +
              std::to_string(topology_.cross_rank) + "/" + std::to_string(topology_.cross_size) +
              ") from " + topology_.source + ", backend " + world_->backend() +
              (detail::wants_hierarchy(world_options_) ? " (hierarchical: shm in each host)" : "") +
              ", job " + topology_.job_id);
}

Runtime::Runtime(std::unique_ptr<Communicator> world, Config config,
                 std::unique_ptr<Communicator> engine_comm, CommunicatorFactory engine_factory)
    : config_(std::move(config)),
      world_(std::move(world)),
      engine_comm_(std::move(engine_comm)),
      engine_factory_(std::move(engine_factory)) {
  if (!world_) {
    throw ContractError(
        "kolo::Runtime: the world communicator is null; build one with "
        "make_thread_communicators() or make_communicator()");
  }
  world_ = watched(std::move(world_), config_);
  topology_.rank = world_->rank();
  topology_.size = world_->size();
  topology_.local_rank = topology_.rank;  // ranks as threads share this host
  topology_.local_size = topology_.size;
  topology_.cross_rank = 0;
  topology_.cross_size = 1;
  topology_.source = "threads";
  topology_.job_id = "threads-" + std::to_string(getpid());
  topology_.placement_known = true;
}

Runtime::~Runtime() {
  const detail::Logger logger = detail::Logger::from_config(config_, topology_.rank);
  try {
    // The engine first: its thread stops together with the other ranks'
    // engines, then its communicators go; the world communicator after it.
    engine_.reset();
    engine_comm_.reset();
    world_.reset();
    if (store_ && topology_.size > 1) {
      // Rank 0 serves the store under torchrun-style launch: it keeps serving
      // until every rank has finished with it, or the grace time passes.
      store_->set("done/" + std::to_string(topology_.rank), to_bytes("1"));
      if (store_server_) {
        std::vector<std::string> keys;
        for (int r = 0; r < topology_.size; ++r) keys.push_back("done/" + std::to_string(r));
        store_->wait(keys, std::min(kShutdownGrace,
                                    milliseconds(static_cast<int64_t>(
                                        config_.get_double("KOLO_TIMEOUT_SECONDS") * 1000.0))));
      }
    }
  } catch (const std::exception& e) {
    // A destructor must not throw; a peer that died is the usual reason.
    logger.warning(std::string("shutdown: ") + e.what());
  }
  store_.reset();
  store_server_.reset();
}

Communicator& Runtime::world() {
  if (!world_) throw ContractError(no_world("world()"));
  return *world_;
}

std::string Runtime::no_world(const std::string& call) const {
  return "kolo::Runtime::" + call + ": rank " + std::to_string(topology_.rank) +
         " rejoined a running parameter-server job (KOLO_PS_REJOIN, kolorun --restart-workers) "
         "and has no world communicator: the other ranks built theirs before it came back. A "
         "rejoining worker talks to the servers only (kolo::ps::connect()); keep collectives "
         "out of parameter-server programs";
}

bool Runtime::request_eviction(int rank, int64_t start, const std::string& why) {
  if (!launcher_store_) return false;
  detail::request_eviction(*launcher_store_, rank, start, why);
  return true;
}

bool Runtime::engine_stopped() {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  return engine_ && engine_->stopped();
}

Engine& Runtime::engine() {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  if (engine_) return *engine_;
  if (!world_) throw ContractError(no_world("engine()"));
  EngineOptions options = EngineOptions::from_config(config_);
  // A rank frozen for the engine is frozen for the world communicator too
  // (it outlives the engine: ~Runtime resets the engine first).
  Communicator* world = world_.get();
  options.on_stall_abort = [world](const std::string& reason, const std::vector<int>& ranks) {
    world->abort(reason, ranks);
  };
  if (backend_.empty()) {
    // Ranks as threads: the caller handed the engine's communicator in.
    if (!engine_comm_) {
      throw ContractError(
          "kolo::Runtime::engine: this ranks-as-threads runtime was built without an engine "
          "communicator; pass a second communicator of the same world (e.g. from another "
          "make_thread_communicators() call) to the Runtime constructor");
    }
    engine_ = std::make_unique<Engine>(std::move(engine_comm_), engine_factory_, options);
    return *engine_;
  }
  CommunicatorOptions engine_options = world_options_;
  engine_options.prefix = world_options_.prefix + "/engine";
  engine_options.check_args = false;
#if KOLO_HAVE_CUDA
  // Each process set's NCCL communicator, for its CUDA tensors, found
  // through the job's store like the host ones (engine/device_path.h).
  if (engine_options.store || topology_.size == 1) {
    const int rank = topology_.rank;
    options.device_communicators = [engine_options, rank](const std::vector<int>& ranks, int set_id,
                                                          int device) {
      CommunicatorOptions o = group_options(
          engine_options, ranks, rank, engine_options.prefix + "/nccl" + std::to_string(set_id),
          "kolo NCCL communicator of process set " + std::to_string(set_id));
      o.device = device;
      return detail::make_nccl_communicator(o);
    };
  }
#endif
  EngineCommunicators comms =
      engine_communicators(backend_, engine_options, topology_.rank, exit_check_);
  engine_ = std::make_unique<Engine>(std::move(comms.world), std::move(comms.factory), options);
  return *engine_;
}

EngineCommunicators Runtime::replica_communicators(const std::string& prefix, int replicas,
                                                   int replica) {
  if (backend_.empty() || backend_ == "mpi") {
    throw ContractError(
        "kolo in-process replicas: replicas of several processes need a runtime of the shm or "
        "gloo backend, but this one is " +
        std::string(backend_.empty() ? "ranks as threads" : "mpi (whose members are processes)") +
        "; start the job with kolorun (or KOLO_BACKEND=shm|gloo), or run one process");
  }
  if (!world_) throw ContractError(no_world("replica_communicators()"));
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    throw ContractError("kolo in-process replicas: replica " + std::to_string(replica) + " of " +
                        std::to_string(replicas) + " does not exist");
  }
  CommunicatorOptions o = world_options_;
  o.rank = topology_.rank * replicas + replica;
  o.size = topology_.size * replicas;
  o.prefix = prefix;
  o.check_args = false;  // the engine validates its requests itself
  o.world_ranks.clear();
  // Member m is replica m % replicas of rank m / replicas, on that rank's host.
  o.rank_hosts.clear();
  for (int host : world_options_.rank_hosts)
    o.rank_hosts.insert(o.rank_hosts.end(), replicas, host);
  return engine_communicators(backend_, o, o.rank);
}

std::string Runtime::next_replica_prefix() {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  return world_options_.prefix + "/replicas" + std::to_string(replica_groups_++);
}

CommunicatorOptions Runtime::with_exit_check(CommunicatorOptions options) const {
  if (!options.rendezvous_check) options.rendezvous_check = exit_check_;
  return options;
}

EngineCommunicators Runtime::engine_communicators(const std::string& backend,
                                                  const CommunicatorOptions& base, int world_rank,
                                                  std::function<void()> world_check) {
  EngineCommunicators comms;
  CommunicatorOptions world = base;
  if (!world.rendezvous_check) world.rendezvous_check = std::move(world_check);
  comms.world = make_communicator(backend, world);
  // Process sets: members build a communicator of their own under a prefix
  // no other set uses (ids are never reused within one engine).
  comms.factory = [backend, base, world_rank](const std::vector<int>& ranks, int set_id) {
    return make_communicator(backend, group_options(base, ranks, world_rank,
                                                    base.prefix + "/set" + std::to_string(set_id),
                                                    "kolo process set " + std::to_string(set_id)));
  };
  return comms;
}

CommunicatorOptions Runtime::group_options(const CommunicatorOptions& base,
                                           const std::vector<int>& ranks, int world_rank,
                                           const std::string& prefix, const std::string& what) {
  auto pos = std::find(ranks.begin(), ranks.end(), world_rank);
  if (pos == ranks.end()) throw ContractError(what + ": this rank is not a member");
  CommunicatorOptions o = base;
  o.rank = static_cast<int>(pos - ranks.begin());
  o.size = static_cast<int>(ranks.size());
  o.prefix = prefix;
  o.world_ranks = ranks;  // mpi builds the group from MPI_COMM_WORLD's group
  o.rank_hosts.clear();
  if (!base.rank_hosts.empty()) {
    for (int r : ranks) o.rank_hosts.push_back(base.rank_hosts[r]);
  }
  return o;
}

std::unique_ptr<Communicator> Runtime::group_communicator(const std::vector<int>& ranks,
                                                          const std::string& name) {
  const std::string what = "kolo::Runtime::group_communicator('" + name + "')";
  if (backend_.empty()) {
    throw ContractError(what +
                        ": this ranks-as-threads runtime has no backend to build communicators "
                        "with; build them with make_thread_communicators()");
  }
  if (!std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.empty() ||
      ranks.front() < 0 || ranks.back() >= topology_.size) {
    throw ContractError(what + ": ranks must be distinct world ranks in [0, " +
                        std::to_string(topology_.size) + ") in ascending order");
  }
  return watched(
      make_communicator(backend_, group_options(world_options_, ranks, topology_.rank,
                                                world_options_.prefix + "/" + name, what)),
      config_, ranks);
}

// ---- process-wide default runtime ----

namespace {

// The one piece of process state in kolo (runtime.h): the Horovod-style
// default runtime behind kolo::init()/kolo::rank()...
struct DefaultRuntime {
  std::mutex mutex;
  std::unique_ptr<Runtime> runtime;
};

DefaultRuntime& default_runtime() {
  static DefaultRuntime instance;
  return instance;
}

// `call`: what the user called, as it reads in the error ("kolo::rank()").
Runtime& initialised(const std::string& call) {
  DefaultRuntime& d = default_runtime();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (!d.runtime) {
    throw ContractError(call + " called before kolo::init(); call kolo::init() first");
  }
  return *d.runtime;
}

}  // namespace

void init(const InitOptions& options) {
  DefaultRuntime& d = default_runtime();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.runtime) {
    throw ContractError(
        "kolo::init() called twice; call kolo::shutdown() before initialising again");
  }
  d.runtime = std::make_unique<Runtime>(options);
}

void shutdown() {
  DefaultRuntime& d = default_runtime();
  std::unique_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    runtime = std::move(d.runtime);
  }
  // Destroyed outside the lock: is_initialized() is already false.
}

bool is_initialized() {
  DefaultRuntime& d = default_runtime();
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.runtime != nullptr;
}

Runtime& runtime() { return initialised("kolo::runtime()"); }
Runtime& runtime_for(const std::string& operation) { return initialised(operation); }
int rank() { return initialised("kolo::rank()").topology().rank; }
int size() { return initialised("kolo::size()").topology().size; }
int local_rank() { return initialised("kolo::local_rank()").topology().local_rank; }
int local_size() { return initialised("kolo::local_size()").topology().local_size; }
int cross_rank() { return initialised("kolo::cross_rank()").topology().cross_rank; }
int cross_size() { return initialised("kolo::cross_size()").topology().cross_size; }
bool is_homogeneous() { return initialised("kolo::is_homogeneous()").topology().homogeneous; }

}  // namespace kolo
