// Communicator: a synchronous collective engine on raw memory.
//
// Contract shared by every backend (shm, gloo, mpi, threads):
//  - Every rank of the communicator calls the same collectives in the same order
//    with matching arguments (count, dtype, op, root, scale factors). Backends
//    check this across ranks and throw ContractError on every rank, naming the
//    operation, the argument, the ranks and both values, when it does not hold.
//  - Counts are in elements, not bytes. A count of 0 is legal.
//  - `in == out` selects the in-place variant; otherwise the buffers must not
//    overlap.
//  - Each call takes an options struct; a timeout of 0 means the communicator's
//    default (KOLO_TIMEOUT_SECONDS). A call that does not complete in time throws
//    TimeoutError; a dead peer throws RuntimeFault naming it.
//  - Calls on one communicator must not run concurrently (the engine calls them
//    from its single background thread). Different communicators are independent.
//  - After a RuntimeFault the communicator is unusable: destroy it and build a new
//    one (with a fresh store prefix) from the surviving ranks.
//
// Point-to-point transfers (send, recv, isend, irecv) follow the same contract
// between the two ranks involved; see "Point to point" below.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/core/dtype.h"
#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class Store;

// Options common to every collective.
struct CollectiveOptions {
  std::chrono::milliseconds timeout{0};  // 0 = communicator default
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;   // applied to each rank's input before reducing
  double postscale = 1.0;  // applied to the reduced result
  std::chrono::milliseconds timeout{0};
};

struct BroadcastOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
};

// Options of the point-to-point transfers (send, recv, isend, irecv).
struct P2POptions {
  // A receive takes the sends of its peer with the same tag, in the order they
  // were posted (MPI's non-overtaking rule); tags keep independent streams
  // between the same two ranks apart. In [0, kMaxP2PTag].
  int tag = 0;
  // 0 = the communicator's default (KOLO_TIMEOUT_SECONDS). Counted from the
  // call (isend/irecv: from the post, not from wait()).
  std::chrono::milliseconds timeout{0};
};
constexpr int kMaxP2PTag = (1 << 24) - 1;

namespace detail {
class KOLO_HIDDEN P2POp;
}

// A pending isend or irecv. Copyable; copies share the transfer.
//
// The buffer handed to isend/irecv must stay valid and untouched until the
// transfer finished (wait() returned or threw, or test() returned true).
// Dropping every handle does not cancel the transfer: it completes (or fails)
// on its own, and the buffer must outlive it; destroying the communicator
// fails whatever is still pending.
class P2PHandle {
 public:
  P2PHandle() = default;
  explicit P2PHandle(std::shared_ptr<detail::P2POp> op) : op_(std::move(op)) {}

  bool valid() const { return op_ != nullptr; }
  // Moves the transfer along as far as it can without blocking; true once it
  // finished, successfully or not (wait() then returns at once or throws).
  bool test();
  // Blocks until the transfer finished or its timeout passed. Throws
  // ContractError when sender and receiver disagree on count or dtype (on both
  // sides; the communicator stays usable), RuntimeFault naming the peer when
  // it died or left, TimeoutError when the timeout passed (both leave the
  // communicator unusable). Calling it again repeats the outcome.
  void wait();

 private:
  std::shared_ptr<detail::P2POp> op_;
};

// One buffer of a fused allreduce (Communicator::allreduce_segments):
// `count` elements read from `in`, their reduction written to `out` (in ==
// out: in place; otherwise they must not overlap, nor touch other segments).
struct AllreduceSegment {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm", "gloo", "mpi" or "threads".
  virtual const char* backend() const = 0;

  // out[i] = postscale * op_k(prescale * in_k[i]) over ranks k; `count` elements.
  virtual void allreduce(const void* in, void* out, size_t count, DType dtype,
                         const AllreduceOptions& options) = 0;

  // out = concat over ranks of each rank's `count` elements: out holds size()*count.
  // In place (MPI_IN_PLACE layout): in == out + rank()*count elements, i.e. this
  // rank's block already sits at its position in out.
  virtual void allgather(const void* in, void* out, size_t count, DType dtype,
                         const CollectiveOptions& options) = 0;

  // Variable counts: rank k contributes counts[k] elements (its own `in` holds
  // counts[rank()]); out holds sum(counts) in rank order. counts must be identical
  // on every rank. In place: in == out + (sum of counts[k] for k < rank()).
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                          const CollectiveOptions& options) = 0;

  // Root's buffer is copied to every rank's buffer.
  virtual void broadcast(void* buffer, size_t count, DType dtype,
                         const BroadcastOptions& options) = 0;

  // `in` holds size()*count elements; rank r receives into `out` (count elements)
  // the reduction of every rank's block r. In place: out == in (the result is
  // written over the first `count` elements of in).
  virtual void reducescatter(const void* in, void* out, size_t count, DType dtype,
                             const AllreduceOptions& options) = 0;

  // `in` holds size()*count elements: block k goes to rank k. `out` holds
  // size()*count elements: block k came from rank k. In place: in == out.
  virtual void alltoall(const void* in, void* out, size_t count, DType dtype,
                        const CollectiveOptions& options) = 0;

  // send_counts[k] elements go to rank k (taken consecutively from `in`);
  // recv_counts[k] elements arrive from rank k (placed consecutively in `out`).
  // send_counts[k] on rank r must equal recv_counts[r] on rank k. Not in place.
  virtual void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                         const std::vector<size_t>& recv_counts, DType dtype,
                         const CollectiveOptions& options) = 0;

  virtual void barrier(const CollectiveOptions& options) = 0;

  // Tensor fusion without a fusion buffer. allreduce_segments is one
  // allreduce of the concatenation of `segments` (in list order): the same
  // collective as allreduce() with count = the sum of the segments' counts,
  // which is what is checked across ranks (ranks may cut the vector into
  // segments differently). Each segment's input is read and its output written
  // in place where it lies. Only backends whose native_segments() is true
  // implement it: shm copies each segment straight into its shared memory and
  // the results straight out of it, so the packing copy is the only one. The
  // others throw ContractError; callers pack into one buffer and call
  // allreduce() instead (the engine does, timing the copies in its timeline).
  virtual bool native_segments() const { return false; }
  virtual void allreduce_segments(const std::vector<AllreduceSegment>& segments, DType dtype,
                                  const AllreduceOptions& options);

  // ---- Point to point ----
  //
  // `count` elements of `dtype` go from this rank to `peer` (send) or from
  // `peer` into `data` (recv); peer is a rank of this communicator other than
  // rank(). Every send must be matched by a recv on the peer with the same
  // tag, count and dtype: a mismatch is a ContractError on both sides, naming
  // both ranks and both values, and moves no data. Messages of any size are
  // moved in bounded pieces; nothing is buffered for a receive that has not
  // been posted (a send completes once its receiver took the data, or, on
  // shm, once the data sits in the pair's shared buffer). A peer that dies or
  // destroys its communicator while a transfer with it is pending is a
  // RuntimeFault naming it; a transfer not done within its timeout a
  // TimeoutError. Progress: transfers move while this rank is inside any
  // point-to-point call of the communicator (wait(), test(), send, recv,
  // isend, irecv); gloo and mpi also move them in the background.
  //
  // The blocking forms are isend/irecv followed by wait().
  virtual void send(const void* data, size_t count, DType dtype, int peer,
                    const P2POptions& options);
  virtual void recv(void* data, size_t count, DType dtype, int peer, const P2POptions& options);
  virtual P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                          const P2POptions& options);
  virtual P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                          const P2POptions& options);

  // Both are thread-safe and never block: a watchdog (the engine's stall
  // check, engine/stall_inspector.h) calls them while a call of this
  // communicator is blocked in another thread.
  //
  // The ranks the call in progress still waits for, as far as the transport
  // can tell: an empty list when no call waits, nullopt when the transport
  // cannot tell (mpi).
  virtual std::optional<std::vector<int>> waiting_for() const { return std::nullopt; }
  // Gives up on this communicator: the call in progress, if any, and every
  // later call on this rank fail with RuntimeFault(reason, ranks), and it is
  // unusable. `ranks` are the ranks blamed (a watchdog names the missing
  // ones); empty means this rank gives up by itself (a composite whose other
  // part failed, a caller that stops waiting): the message becomes "rank R
  // aborted: <reason>" and peers name this rank. Peers blocked on this rank,
  // or entering a call with it, fail at once with a RuntimeFault naming the
  // blamed ranks (shm marks the shared segment aborted; gloo publishes its
  // fault report and closes its connections; threads breaks the world). mpi
  // ends only this rank's call, with `ranks` as given (empty: unknown), and
  // its peers fail at their own timeout.
  // Returns false when the backend cannot end a call in progress (it then
  // ends at its timeout).
  virtual bool abort(const std::string& reason, const std::vector<int>& ranks) {
    (void)reason;
    (void)ranks;
    return false;
  }
};

// How to build one communicator. Every member builds it with the same `prefix`
// and `size`; the store is how members find each other.
struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;  // rendezvous; may be null only for size 1 and mpi
  // Namespace for this communicator's keys in the store and for its shared
  // segment. Rebuilding after a failure uses a new prefix ("world/1", ...).
  std::string prefix = "world/0";
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // default per call
  // Validate counts/dtypes/ops across ranks on every call (gloo and mpi pay one
  // small extra exchange for it; shm checks for free). The engine turns it off
  // for collectives it has already negotiated.
  bool check_args = true;
  // A communicator of some of the world's ranks (process sets): their world
  // ranks, sorted, with this process's at index `rank`; size = its length.
  // Empty = the whole world. Needed by mpi (which builds the communicator from
  // MPI_COMM_WORLD's group); shm and gloo find their members through the store
  // and ignore it.
  std::vector<int> world_ranks;
  // Settings below are read once, at init, from the Config (the Runtime fills
  // them); communicators never read the environment themselves.
  // shm only. Microseconds a waiting rank spins before it blocks on a futex, and
  // bytes per pipeline chunk (the same on every rank). < 0 = the registry's
  // defaults of KOLO_SHM_SPIN_US / KOLO_SHM_CHUNK_BYTES.
  int shm_spin_us = -1;
  int64_t shm_chunk_bytes = -1;
  // gloo only. Interface to bind (KOLO_GLOO_IFACE); "" = choose (architecture.md).
  std::string gloo_iface;
  // The name ranks compare to find which share a host (KOLO_HOSTNAME); "" =
  // gethostname().
  std::string host_name;
  // Hierarchical composition (KOLO_HIERARCHICAL: "auto", "on" or "off") and
  // the host of every member: rank_hosts[k] = index of member k's host
  // (size() entries; empty = unknown, which means flat). With "auto", a
  // communicator whose members span more than one host with more than one on
  // some host, the same number on every host, is built as shm (within each
  // host) composed with this backend (across hosts): see
  // core/src/comm/hierarchical_communicator.h. "on" also composes with one
  // member per host, and refuses uneven hosts; "off" is always flat.
  std::string hierarchical = "off";
  std::vector<int> rank_hosts;
  // Called about every 100 ms while this rank waits for its peers to arrive
  // at the communicator's rendezvous outside the store (shm's shared
  // segment); it may throw (RuntimeFault) to abandon a rendezvous that cannot
  // complete: an elastic round kolorun gave up on (core/src/elastic/round_store.h).
  // Waits in the store are the store's to cut short. Null = wait until `timeout`.
  std::function<void()> rendezvous_check;
  // nccl only (the engine's device communicators): this member's CUDA device.
  int device = 0;
};

// Backend names accepted by make_communicator.
std::vector<std::string> compiled_backends();

// Builds a communicator of backend "shm", "gloo" or "mpi". Throws ContractError
// for an unknown or not-compiled backend, RuntimeFault if peers do not arrive.
std::unique_ptr<Communicator> make_communicator(const std::string& backend,
                                                const CommunicatorOptions& options);

// Ranks as threads: builds all `size` communicators of one in-process world at
// once; hand communicator k to thread k. For tests and single-process demos.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(300));

}  // namespace kolo
#pragma GCC visibility pop
