// Cross-rank argument checking (internal).
//
// Every collective call is summarised as a fixed-size CallSignature. Backends
// exchange signatures (shm: in the shared control block, for free; gloo/mpi:
// one small allgather when CommunicatorOptions::check_args is on) and call
// check_signatures(), which throws the same ContractError on every rank when
// they disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/dtype.h"

namespace kolo::detail {

enum class CollectiveKind : uint8_t {
  kAllreduce,
  kAllgather,
  kAllgatherv,
  kBroadcast,
  kReducescatter,
  kAlltoall,
  kAlltoallv,
  kBarrier
};
const char* collective_name(CollectiveKind kind);

// Trivially copyable; 48 bytes. Fields that do not apply to a kind are zero.
struct CallSignature {
  uint64_t sequence = 0;  // per-communicator call number (catches skipped calls)
  uint64_t count = 0;     // elements (allgatherv: hash_counts(counts); alltoallv: 0, because
                          // its count vectors differ per rank by design, see
                          // check_alltoallv_counts)
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = 0;
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  uint8_t pad[9] = {};
};
static_assert(sizeof(CallSignature) == 48, "CallSignature is exchanged as raw bytes");

// Signature of a call without reduction arguments (sequence and root left 0).
CallSignature plain_signature(CollectiveKind kind, uint64_t count, DType dtype);
// Signature of an allreduce / reducescatter: adds op and scale factors.
CallSignature reduce_signature(CollectiveKind kind, uint64_t count, DType dtype,
                               const AllreduceOptions& options);

// Hash of a counts vector, stable across ranks (for allgatherv / alltoallv).
uint64_t hash_counts(const std::vector<size_t>& counts);

// Throws ContractError if any signature differs from rank 0's, e.g.
// "kolo allreduce: count differs across ranks: rank 0 passed 1000, rank 2 passed 999.
//  Every rank must call allreduce with the same count."
// `signatures[k]` is rank k's. Called identically on every rank -> same error everywhere.
void check_signatures(const std::vector<CallSignature>& signatures);

// Local argument validation at the API boundary (null pointer with count > 0,
// bad root, vector sizes != world size, unsupported op for dtype...). Throws
// ContractError naming the operation, the argument and the value.
void check_local_args(CollectiveKind kind, int size, const void* in, const void* out, size_t count,
                      const AllreduceOptions* reduce_options, int root);

// Local check of a counts vector argument (allgatherv counts, alltoallv
// send_counts / recv_counts): it must hold exactly `size` entries. `argument`
// names it in the message ("counts", "send_counts", "recv_counts").
void check_counts_arg(CollectiveKind kind, const char* argument, const std::vector<size_t>& counts,
                      int size);

// Local checks of alltoallv's arguments, shared by every backend: both counts
// vectors hold `size` entries, a buffer whose counts add up to more than 0 is
// not null, and in != out (alltoallv has no in-place form).
void check_alltoallv_args(int size, const void* in, const std::vector<size_t>& send_counts,
                          const void* out, const std::vector<size_t>& recv_counts);

// alltoallv consistency across ranks, for backends that see every rank's
// vectors (threads, shm): send_counts[r][k] must equal recv_counts[k][r].
// Throws the same ContractError on every rank, naming both ranks and values.
void check_alltoallv_counts(const std::vector<std::vector<size_t>>& send_counts,
                            const std::vector<std::vector<size_t>>& recv_counts);

}  // namespace kolo::detail
