// Where this process sits in the job: rank, size, local and cross placement,
// and how to reach the rendezvous store. Found from the launcher's variables.
#pragma once

#include <string>
#include <vector>

#include "kolo/core/config.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // index among the ranks on this host
  int local_size = 1;  // ranks on this host
  int cross_rank = 0;  // index of this host among the hosts (ordered by lowest rank)
  int cross_size = 1;  // number of hosts
  // Every host runs the same number of ranks (Horovod's is_homogeneous);
  // found at init with one small allreduce over the world.
  bool homogeneous = true;
  // Which launcher the values came from: "kolorun", "openmpi", "pmi", "slurm",
  // "torchrun" or "none" (a world of one).
  std::string source = "none";
  // Rendezvous store address; empty when the source provides none (mpi needs none).
  std::string store_host;
  int store_port = 0;
  // True when this process must serve the store itself (torchrun-style rank 0).
  bool serve_store = false;
  // "kolo": kolo's TcpStoreServer protocol. "c10d": the launcher already serves
  // a PyTorch c10d TCPStore at store_host:store_port (torchrun >= 2.4 with
  // TORCHELASTIC_USE_AGENT_STORE=True, or KOLO_STORE=c10d); nobody in the job
  // serves, and kolo::init_torch() (kolo/torch/c10d_store.h) joins it.
  std::string store_kind = "kolo";
  // Unique per job (names shared-memory segments); derived from the source.
  std::string job_id;
  // Whether local_* / cross_* were given by the source; otherwise the runtime
  // computes them by exchanging host names through the store or communicator.
  bool placement_known = false;
};

// Detects the topology from the environment, in order: kolorun (KOLO_RANK...),
// OpenMPI (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE), Slurm
// (SLURM_PROCID, SLURM_NTASKS), torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT). None of them: a world of one. Inconsistent values
// (rank >= size, a non-number) throw ContractError naming the variable.
Topology detect_topology(const EnvLookup& env, const Config& config);

// The numeric IPv4 address at which processes on `peer_hosts` can reach this
// host, whose name is `this_host`: its name's address when that is not
// loopback (the usual case on a cluster); otherwise (Debian maps the host
// name to 127.0.1.1, and test hosts in network namespaces have no name of
// their own for this machine) the local end of the route toward the first
// peer whose name resolves; otherwise the first non-loopback interface that
// is up; otherwise `this_host` itself. Peers that name this host or loopback
// are skipped. Used for gloo's device address and kolorun's store address.
std::string reachable_address(const std::string& this_host,
                              const std::vector<std::string>& peer_hosts);

}  // namespace kolo
#pragma GCC visibility pop
