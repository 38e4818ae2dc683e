// The one place where every KOLO_* setting is declared (config.h).
// Add a setting here, then regenerate docs/env_vars.md:
//   build/launcher/kolorun --print-env-docs > docs/env_vars.md
#include "kolo/core/config.h"

namespace kolo {

const std::vector<ConfigVar>& config_registry() {
  static const std::vector<ConfigVar> registry = {
      // --- Bootstrap (set by kolorun for its workers) ---
      {"KOLO_RANK", ConfigType::kInt, "", "", "Rank of this worker in the world (set by kolorun)."},
      {"KOLO_SIZE", ConfigType::kInt, "", "", "Number of workers in the world (set by kolorun)."},
      {"KOLO_LOCAL_RANK", ConfigType::kInt, "", "", "Index of this worker among those on its host."},
      {"KOLO_LOCAL_SIZE", ConfigType::kInt, "", "", "Number of workers on this worker's host."},
      {"KOLO_CROSS_RANK", ConfigType::kInt, "", "", "Index of this worker's host among the hosts."},
      {"KOLO_CROSS_SIZE", ConfigType::kInt, "", "", "Number of hosts in the job."},
      {"KOLO_STORE_ADDR", ConfigType::kString, "", "",
       "Host of the rendezvous store served by kolorun."},
      {"KOLO_STORE_PORT", ConfigType::kInt, "", "", "TCP port of the rendezvous store."},
      {"KOLO_JOB_ID", ConfigType::kString, "", "",
       "Unique id of the job; names shared-memory segments. Default: derived from the launcher."},
      {"KOLO_HOSTNAME", ConfigType::kString, "", "",
       "Name this worker reports for its host when grouping ranks by host. Default: gethostname()."},
      // --- Communicators ---
      {"KOLO_BACKEND", ConfigType::kChoice, "auto", "auto|shm|gloo|mpi",
       "Communicator backend. auto: mpi under mpirun/srun, shm when all ranks share a host, "
       "gloo otherwise."},
      {"KOLO_TIMEOUT_SECONDS", ConfigType::kDouble, "300", "",
       "Default timeout of one collective and of the rendezvous, in seconds (> 0)."},
      {"KOLO_CHECK_ARGS", ConfigType::kBool, "1", "",
       "Check on every call that count, dtype and op agree across ranks (gloo/mpi pay one small "
       "exchange; shm checks for free)."},
      {"KOLO_SHM_SPIN_US", ConfigType::kInt, "50", "",
       "shm: microseconds a waiting rank spins before it blocks on a futex (>= 0). Spinning "
       "longer lowers latency but steals the core of an oversubscribed peer."},
      {"KOLO_SHM_CHUNK_BYTES", ConfigType::kInt, "262144", "",
       "shm: bytes per pipeline chunk of large collectives (sized to stay in cache)."},
      {"KOLO_GLOO_IFACE", ConfigType::kString, "", "",
       "gloo: network interface to bind (e.g. eth0). Default: the address of this host's name, "
       "or loopback when all ranks are local."},
      // --- Diagnostics ---
      {"KOLO_LOG_LEVEL", ConfigType::kChoice, "warning", "error|warning|info|debug",
       "Least severe message that kolo prints to stderr."},
  };
  return registry;
}

}  // namespace kolo
