// The one place where every KOLO_* setting is declared (config.h).
// Add a setting here, then regenerate docs/env_vars.md:
//   build/launcher/kolorun --print-env-docs > docs/env_vars.md
#include "kolo/core/config.h"

namespace kolo {

const std::vector<ConfigVar>& config_registry() {
  static const std::vector<ConfigVar> registry = {
      // --- Bootstrap (set by kolorun for its workers) ---
      {"KOLO_RANK", ConfigType::kInt, "", "",
       "Rank of this worker in the world (set by kolorun) (>= 0, <= 2147483647)."},
      {"KOLO_SIZE", ConfigType::kInt, "", "",
       "Number of workers in the world (set by kolorun) (>= 1, <= 2147483647)."},
      {"KOLO_LOCAL_RANK", ConfigType::kInt, "", "",
       "Index of this worker among those on its host (>= 0, <= 2147483647)."},
      {"KOLO_LOCAL_SIZE", ConfigType::kInt, "", "",
       "Number of workers on this worker's host (>= 1, <= 2147483647)."},
      {"KOLO_CROSS_RANK", ConfigType::kInt, "", "",
       "Index of this worker's host among the hosts (>= 0, <= 2147483647)."},
      {"KOLO_CROSS_SIZE", ConfigType::kInt, "", "",
       "Number of hosts in the job (>= 1, <= 2147483647)."},
      {"KOLO_STORE_ADDR", ConfigType::kString, "", "",
       "Host of the rendezvous store served by kolorun."},
      {"KOLO_STORE_PORT", ConfigType::kInt, "", "",
       "TCP port of the rendezvous store (>= 1, <= 65535)."},
      {"KOLO_STORE", ConfigType::kChoice, "auto", "auto|kolo|c10d",
       "Kind of rendezvous store. kolo: kolo's own TCP store (served by kolorun, or by rank 0 at "
       "MASTER_ADDR:MASTER_PORT). c10d: a PyTorch c10d TCPStore that the launcher already serves "
       "at MASTER_ADDR:MASTER_PORT (or KOLO_STORE_ADDR:KOLO_STORE_PORT), joined as a client "
       "through kolo::init_torch(); refused under kolorun, which serves kolo's own. auto: c10d "
       "when TORCHELASTIC_USE_AGENT_STORE=True (torchrun >= 2.4, not under kolorun), else kolo."},
      {"KOLO_JOB_ID", ConfigType::kString, "", "",
       "Unique id of the job; names shared-memory segments. Default: derived from the launcher."},
      {"KOLO_HOSTNAME", ConfigType::kString, "", "",
       "Name this worker reports for its host when grouping ranks by host. Default: "
       "gethostname()."},
      {"KOLO_JOB_SECRET", ConfigType::kString, "", "",
       "Per-job secret (hex) that signs every message to and from the rendezvous store "
       "(HMAC-SHA256); kolorun sets it for every worker of a job that spans hosts and of an "
       "elastic job (remote workers read it from ssh's stdin: it is on no command line). "
       "Unset: the store is unauthenticated (kolorun's then listens on loopback only)."},
      {"KOLO_STORE_MAX_MESSAGE_BYTES", ConfigType::kInt, "16777216", "",
       "Rendezvous store server (kolorun, or rank 0 under torchrun-style launch): largest "
       "request it takes (key + value), in bytes; a bigger one is answered with an error and "
       "its bytes are skipped unread (64 .. 2^30)."},
      {"KOLO_STORE_MAX_CONNECTIONS", ConfigType::kInt, "1024", "",
       "Rendezvous store server: open connections; at the limit a new one replaces the oldest "
       "that has not yet sent a valid request, else it is refused (>= 1)."},
      {"KOLO_STORE_IDLE_TIMEOUT_SECONDS", ConfigType::kDouble, "300", "",
       "Rendezvous store server: a connection without traffic or a waiting request for this "
       "long is closed (clients reconnect by themselves); one that has not sent a whole valid "
       "request is closed after 10 s at most (> 0)."},
      // --- Elastic mode (set by kolorun --min-np/--max-np/--host-discovery-script) ---
      {"KOLO_ELASTIC", ConfigType::kBool, "0", "",
       "1 when kolorun started this worker in elastic mode: kolo::elastic::run() joins "
       "kolorun's rendezvous instead of reading KOLO_RANK/KOLO_SIZE."},
      {"KOLO_WORKER_ID", ConfigType::kInt, "", "",
       "Elastic mode: kolorun's id of this worker process, unique within the job."},
      {"KOLO_ELASTIC_HOST", ConfigType::kString, "", "",
       "Elastic mode: the host (as listed by -H or the discovery script) this worker runs on."},
      {"KOLO_ELASTIC_TIMEOUT_SECONDS", ConfigType::kDouble, "600", "",
       "Elastic mode: how long a worker waits for kolorun to form a world that includes it; "
       "kolorun itself stops the job sooner when too few workers remain (>= 0.001, <= "
       "1000000000)."},
      // --- Parameter server ---
      {"KOLO_PS_SERVERS", ConfigType::kInt, "0", "",
       "Parameter server: the last this-many ranks of the job are servers, the others workers "
       "(set by `kolorun --servers S`; set it yourself under mpirun) (>= 0, <= 65536); 0 = no "
       "servers."},
      {"KOLO_PS_REJOIN", ConfigType::kInt, "0", "",
       "Parameter server: set by `kolorun --restart-workers N` on a worker it restarted into a "
       "running asynchronous job: the how-many-th restart of that worker it is (>= 0, <= 1000000); "
       "the "
       "runtime then builds no world communicator and kolo::ps::connect() rejoins the servers. "
       "0 = a first start."},
      // --- Communicators ---
      {"KOLO_BACKEND", ConfigType::kChoice, "auto", "auto|shm|gloo|mpi",
       "Communicator backend. auto: mpi under mpirun/srun, shm when all ranks share a host, "
       "gloo otherwise."},
      {"KOLO_TIMEOUT_SECONDS", ConfigType::kDouble, "300", "",
       "Default timeout of one collective and of the rendezvous, in seconds (>= 0.001, <= "
       "1000000000): kolo's timeouts count whole milliseconds."},
      {"KOLO_CHECK_ARGS", ConfigType::kBool, "1", "",
       "Check on every call that count, dtype and op agree across ranks (gloo/mpi pay one small "
       "exchange; shm checks for free)."},
      {"KOLO_SHM_SPIN_US", ConfigType::kInt, "50", "",
       "shm: microseconds a waiting rank spins before it blocks on a futex (>= 0, <= 1000000). "
       "Spinning "
       "longer lowers latency but steals the core of an oversubscribed peer."},
      {"KOLO_SHM_CHUNK_BYTES", ConfigType::kInt, "262144", "",
       "shm: bytes per pipeline chunk of large collectives (sized to stay in cache) (>= 4096, <= "
       "1073741824)."},
      {"KOLO_HIERARCHICAL", ConfigType::kChoice, "auto", "auto|on|off",
       "Hierarchical collectives: shm within each host composed with gloo or mpi across hosts "
       "(reduce-scatter in the host, one cross-host ring per local rank, allgather in the host). "
       "auto: when ranks span more than one host, some host has more than one rank and every "
       "host has the same number; on: whenever ranks span hosts (uneven hosts are an error); "
       "off: flat."},
      {"KOLO_CUDA_COMM", ConfigType::kChoice, "auto", "auto|nccl|staged",
       "CUDA tensors: auto runs them on NCCL where kolo was built with CUDA and every rank of "
       "the process set has a GPU of its own, and otherwise copies them through pinned host "
       "memory into the host backend (staged); nccl: NCCL or an error saying why not; staged: "
       "always through the host backend. Reductions NCCL cannot do exactly (int16, a prescale "
       "or postscale) are staged in every mode."},
      {"KOLO_GLOO_IFACE", ConfigType::kString, "", "",
       "gloo: network interface to bind (e.g. eth0). Default: the address of this host's name, "
       "or loopback when all ranks are local."},
      // --- Engine (asynchronous named collectives) ---
      {"KOLO_CYCLE_TIME_MS", ConfigType::kDouble, "1", "",
       "Engine: milliseconds between negotiation cycles of the background thread (>= 0, <= "
       "1000); 0 = no sleep, lowest latency. Longer cycles collect more tensors per fused "
       "collective."},
      {"KOLO_FUSION_THRESHOLD_BYTES", ConfigType::kInt, "67108864", "",
       "Engine: largest fused collective in bytes; ready tensors of one dtype and op are packed "
       "into one buffer up to this size (0 = no fusion)."},
      {"KOLO_CACHE_CAPACITY", ConfigType::kInt, "1024", "",
       "Engine: responses remembered by name, so that steady-state steps agree through one "
       "small bit-vector allreduce instead of exchanging request lists (>= 0, <= 1048576); 0 = no "
       "cache."},
      {"KOLO_STALL_WARNING_SECONDS", ConfigType::kDouble, "30", "",
       "Engine: a stall is reported after this long, and again every period while it lasts "
       "(> 0, <= 1000000000): rank 0 names tensors that some ranks submitted and others did not, "
       "and a rank "
       "that does not negotiate at all (frozen by SIGSTOP or a debugger, stuck) is named by the "
       "lowest rank waiting for it."},
      {"KOLO_STALL_SHUTDOWN_SECONDS", ConfigType::kDouble, "300", "",
       "Engine: after this long (>= 0, <= 1000000000) a stall fails the pending work of every rank "
       "still running with "
       "a RuntimeFault naming the missing ranks (the recoverable error; elastic mode re-forms "
       "without them). 0 = never: a frozen rank then holds the others until "
       "KOLO_TIMEOUT_SECONDS."},
      {"KOLO_TIMELINE", ConfigType::kString, "", "",
       "Engine: write a Chrome-trace timeline (Perfetto, chrome://tracing) of rank 0's requests "
       "to this path."},
      {"KOLO_TIMELINE_ALL_RANKS", ConfigType::kBool, "0", "",
       "Engine: every rank writes its own timeline, KOLO_TIMELINE with '.json' replaced by "
       "'.rank<N>.json'."},
      {"KOLO_AUTOTUNE", ConfigType::kBool, "0", "",
       "Engine: search the fusion threshold and cycle time during the first steps and keep the "
       "fastest (rank 0 decides; all ranks switch together)."},
      {"KOLO_AUTOTUNE_LOG", ConfigType::kString, "", "",
       "Engine: CSV file for the autotuner's trials (default: trials are logged to stderr)."},
      // --- Diagnostics ---
      {"KOLO_LOG_LEVEL", ConfigType::kChoice, "warning", "error|warning|info|debug",
       "Least severe message that kolo prints to stderr."},
  };
  return registry;
}

}  // namespace kolo
