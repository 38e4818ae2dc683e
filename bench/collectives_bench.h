// `kolo-bench collectives`: latency and bandwidth of every collective on every
// backend that can run here, with the peers (raw MPI_Allreduce, raw Gloo ring
// chunked, memcpy bandwidth) measured in the same run; and a point-to-point
// ping-pong on every backend next to raw MPI_Send/MPI_Recv. Across hosts, the
// cross-host algorithms against the link's TCP rate (docs/hosts.md).
#pragma once

#include <string>
#include <vector>

#include "timing.h"

namespace kolo::bench {

struct CollectivesOptions {
  size_t min_bytes = 4;
  size_t max_bytes = size_t{256} << 20;
  int size_step = 4;  // sizes are min_bytes * step^k
  std::vector<std::string> ops = {"allreduce", "allgather", "reducescatter", "broadcast",
                                  "alltoall"};
  // Backends to measure besides the world's own; "all" = every compiled one
  // that can be built here.
  std::vector<std::string> backends = {"all"};
  bool baselines = true;
  bool json = false;         // one JSON object per row on stdout (rank 0)
  std::string docs_path;     // when set, rank 0 rewrites its section of this file
  std::string command_line;  // recorded in the docs section
  TimingOptions timing;
  // Point-to-point ping-pong between ranks 0 and 1 on every backend (and raw
  // MPI_Send/MPI_Recv under mpirun): one-way latency and bandwidth.
  bool pingpong = true;
  // Ranks spanning several hosts (the launcher's placement): the algorithms
  // that cross hosts are measured instead of the world's own backend (gloo's
  // flat ring, the hierarchical shm + gloo composition, and under mpirun kolo's
  // flat mpi backend), next to the link's own TCP rate (one and
  // `link_streams` streams between the first two hosts). `link` names the link
  // in the JSON rows and the docs section ("unshaped", "1gbit", ...).
  std::string link = "unshaped";
  int link_streams = 4;
};

// Runs inside a worker started by kolorun or mpirun (calls kolo::init itself).
int run_collectives(const CollectivesOptions& options);

}  // namespace kolo::bench
