// The hierarchical communicator (internal): shm within each host composed
// with a network backend across hosts (Horovod's hierarchical allreduce,
// NCCL's tree/ring split by node).
//
// Layout: H hosts with L members each (the same L everywhere). Member k of
// the communicator runs on host rank_hosts[k]; its local index l is its
// position among its host's members in rank order. Three parts:
//   local  the L members of this host (shm; mpi under mpirun), rank order;
//   cross  the H members with this local index, one per host, host order:
//          one cross-host ring per local index, so the L rings of a host
//          share its link and each carries 1/L of the data;
//   flat   every member (the network backend as if flat): argument checks,
//          and the collectives where a hierarchy does not pay.
//
// Algorithms (S bytes per member; cross-host bytes are what the link carries):
//   allreduce      stage into the accumulation type (staged_reduction.h,
//                  padded to L equal slices), reduce-scatter in the host, an
//                  allreduce of each local slice across hosts, finish
//                  (average over every member, postscale), convert back, and
//                  allgather the slices in the host; large buffers in
//                  chunks, pipelined (HierarchicalParts::pipeline_chunk_bytes).
//                  Each host sends
//                  2(H-1)/H * S across its link, against the flat ring's
//                  2(n-1)/n * S * L over the same link (n = H*L members).
//   reducescatter  the blocks of the members with local index l are
//                  reduce-scattered to local member l in the host, then
//                  reduce-scattered across hosts in ring l.
//   allgather      allgather across hosts in ring l, then in the host, then
//                  put in member order.
//   broadcast      across hosts in the root's ring, then in every host from
//                  the member with the root's local index.
//   allgatherv, alltoall(v), barrier: the flat part.
// Semantics are reduce.h's, as on every backend: f16/bf16 accumulate in f32,
// scaled integers in double truncated as Horovod does, average divides by
// every member.
//
// Faults: a RuntimeFault in any part is mapped to the communicator's ranks.
// The rank then takes the view of a blamed rank that gave up first and
// published one (as gloo's fault relay does), publishes its own view in the
// store ("<prefix>/hier/fault/<rank>"), and aborts its parts
// (Communicator::abort), so that members blocked in another part fail at
// once and find that view: every survivor names the rank that died, in the
// communicator's numbering, whichever part it was waiting in.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/store.h"

namespace kolo::detail {

// Members per host, or why the layout cannot be hierarchical.
struct HostLayout {
  std::vector<std::vector<int>> members_of_host;  // host h -> its members, rank order
  std::vector<int> host_of;                       // member -> host
  std::vector<int> local_index;                   // member -> index within its host
  bool even = false;                              // every host has the same count
};

// Groups members by rank_hosts (host indices need not be dense: hosts are
// renumbered by their lowest member).
HostLayout host_layout(const std::vector<int>& rank_hosts);

// Whether options (hierarchical mode, rank_hosts) ask for the composition.
// Throws ContractError for "on" with uneven hosts, naming the counts.
bool wants_hierarchy(const CommunicatorOptions& options);

struct HierarchicalParts {
  int rank = 0;
  HostLayout layout;
  std::unique_ptr<Communicator> local;
  std::unique_ptr<Communicator> cross;
  std::unique_ptr<Communicator> flat;
  std::shared_ptr<Store> store;  // fault reports; null: none (mpi)
  std::string prefix;            // the communicator's own prefix
  std::chrono::milliseconds timeout{300000};
  bool check_args = true;
  // Allreduce runs in chunks of at least this many wire bytes (at most 8
  // chunks), the cross-host part of one chunk overlapping the host's work on
  // its neighbours; a buffer under two chunks runs whole. 0 = never chunk.
  size_t pipeline_chunk_bytes = size_t{4} << 20;
};

std::unique_ptr<Communicator> make_hierarchical_communicator(HierarchicalParts parts);

// Builds the parts with make_communicator: local over shm (mpi when the
// backend is mpi: MPI jobs have no store), cross and flat over `backend`, each
// under its own prefix below options.prefix.
std::unique_ptr<Communicator> build_hierarchical_communicator(const std::string& backend,
                                                              const CommunicatorOptions& options);

}  // namespace kolo::detail
