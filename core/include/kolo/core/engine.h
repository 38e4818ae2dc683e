// The engine: asynchronous, named collectives negotiated across ranks, fused,
// and run on a background thread (Horovod's core, as an explicit object).
//
// Frameworks hand the engine named tensors in whatever order their backward
// pass produces them. A request runs once every rank of its process set has
// submitted a request of the same name; every rank runs ready requests in the
// same order whatever order they were submitted in; requests of one kind,
// dtype, op and process set are packed into one fusion buffer and run as one
// collective. The protocol is written out in core/src/engine/controller.h.
//
// Ownership: the engine never owns framework tensors. A TensorView is a
// pointer + dtype + shape + device; the caller keeps the memory alive and
// untouched until the request's Handle has finished.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/device.h"
#include "kolo/core/dtype.h"
#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class Engine;

// A contiguous, row-major buffer seen by the engine: host memory, or memory
// of a CUDA device (kolo/core/device.h says how the engine moves it).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty = scalar (1 element)
  Device device = {};          // where `data` lives; the CPU by default
  // CUDA: the stream (cudaStream_t) the tensor was produced on; null = the
  // legacy default stream. The engine reads the tensor only after the work
  // queued on it before the request was submitted.
  void* stream = nullptr;

  int64_t numel() const;
  size_t bytes() const;
};

// Called on the engine thread once an output's shape is known (allgather,
// alltoall, reducescatter without a preallocated output): returns the buffer
// to write into, of exactly that shape and the input's dtype.
using AllocateOutput = std::function<TensorView(const std::vector<int64_t>& shape)>;

namespace detail {
struct KOLO_HIDDEN HandleState;
}

// The caller's side of one request. Copyable; all copies share one state.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::HandleState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // True once the request finished (successfully or not). Never blocks.
  bool poll() const;
  // Blocks until the request finished; rethrows its error (ContractError for a
  // cross-rank mismatch, RuntimeFault for a dead peer or a stall shutdown).
  // Throws TimeoutError if it has not finished within `timeout` (the request
  // itself keeps going). A timeout of 0 (the default) sets no limit of its
  // own: the engine finishes or fails every request (its stall inspector,
  // KOLO_STALL_SHUTDOWN_SECONDS, fails a stuck one).
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) const;
  // Runs `callback` once the request finished, with nullptr on success or the
  // error. Runs on the engine thread, or at once on this thread if finished.
  // wait() and poll() report the request finished only after such callbacks
  // have returned (so a callback must not wait on its own handle).
  void on_complete(std::function<void(std::exception_ptr)> callback) const;
  // Rows received from each rank (alltoall) or contributed by each rank
  // (allgather); valid after success.
  std::vector<int64_t> received_splits() const;
  // The output allocated through AllocateOutput; valid after success.
  TensorView output() const;

 private:
  std::shared_ptr<detail::HandleState> state_;
};

// Where a frontend's call runs (the torch frontend's collectives, optimizers
// and checkpoints, the BatchBalancer...): every options struct of a call that
// talks to other ranks derives from it, so these three are set the same way
// everywhere.
struct CallOptions {
  Engine* engine = nullptr;  // nullptr = kolo::runtime().engine() (call kolo::init() first)
  int process_set = 0;       // 0 = all ranks; others from Engine::add_process_set
  // How long a synchronous call waits for each result before TimeoutError.
  // kolo's one convention: 0 = the default of what is waited for (here, no
  // limit of its own: the engine finishes or fails every request, and its
  // stall inspector fails a stuck one); communicator calls' 0 is
  // KOLO_TIMEOUT_SECONDS.
  std::chrono::milliseconds timeout{0};
};

// Per-request options. Scales and op apply to allreduce and reducescatter,
// root to broadcast.
struct RequestOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;         // rank in the process set
  int process_set = 0;  // 0 = all ranks; others from Engine::add_process_set
};

struct EngineOptions {
  double cycle_time_ms = 1.0;                 // KOLO_CYCLE_TIME_MS
  int64_t fusion_threshold_bytes = 64 << 20;  // KOLO_FUSION_THRESHOLD_BYTES; 0 = no fusion
  int cache_capacity = 1024;                  // KOLO_CACHE_CAPACITY; 0 = no cache
  double stall_warning_seconds = 30;          // KOLO_STALL_WARNING_SECONDS
  double stall_shutdown_seconds = 300;        // KOLO_STALL_SHUTDOWN_SECONDS; 0 = never
  std::string timeline_path;                  // KOLO_TIMELINE; "" = off
  bool timeline_all_ranks = false;            // KOLO_TIMELINE_ALL_RANKS: path.rank<N>.json
  bool autotune = false;                      // KOLO_AUTOTUNE
  std::string autotune_log;                   // KOLO_AUTOTUNE_LOG; "" = stderr only
  std::string log_level = "warning";          // KOLO_LOG_LEVEL (stall warnings, faults)
  // Called, from the engine's stall-watch thread, after the engine aborted
  // its communicator because a rank stopped negotiating for
  // stall_shutdown_seconds (the reason and the missing world ranks). The
  // Runtime aborts its world communicator with it, so that a collective
  // called on that directly (e.g. an elastic commit) fails at once too.
  std::function<void(const std::string& reason, const std::vector<int>& ranks)> on_stall_abort;
  // CUDA tensors. device_runtime: the device operations (null = cuda_runtime(),
  // loaded at the first CUDA tensor; tests pass a fake). cuda_comm
  // (KOLO_CUDA_COMM): "auto" runs a process set's CUDA tensors on NCCL when
  // device_communicators is set and every member has a GPU of its own, and
  // stages them through the host communicator otherwise; "nccl" insists on
  // NCCL (a ContractError where it cannot run); "staged" always stages.
  // device_communicators builds a set's NCCL communicator (world ranks,
  // sorted; the set's id; this rank's device), on every member alike; the
  // Runtime supplies it where kolo was built with CUDA.
  std::shared_ptr<DeviceRuntime> device_runtime;
  std::string cuda_comm = "auto";
  std::function<std::unique_ptr<Communicator>(const std::vector<int>& ranks, int set_id,
                                              int device)>
      device_communicators;

  static EngineOptions from_config(const Config& config);
};

// A process set as this rank sees it (Horovod's ProcessSet): a group of world
// ranks whose collectives run among themselves. Calls take its id
// (CallOptions::process_set, RequestOptions::process_set); 0 is every rank.
class ProcessSet {
 public:
  int id() const { return id_; }
  // The set's world ranks, ascending.
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  // Whether this rank is a member, and its index in ranks() (-1 if not).
  bool included() const { return rank_ >= 0; }
  int rank() const { return rank_; }

 private:
  friend class Engine;
  ProcessSet(int id, std::vector<int> ranks, int world_rank);
  int id_ = 0;
  std::vector<int> ranks_;
  int rank_ = -1;
};

// Builds the communicator of a process set. `ranks` are world ranks (sorted);
// called on every member with the same arguments. Supplied by the runtime (it
// owns the store and knows the backend).
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(const std::vector<int>& ranks, int set_id)>;

class Engine {
 public:
  // `world` must be used by nobody else (the engine calls it from its thread);
  // `factory` builds communicators for process sets.
  Engine(std::unique_ptr<Communicator> world, CommunicatorFactory factory,
         const EngineOptions& options);
  // Stops the thread; pending handles fail with RuntimeFault("engine shut down").
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const;
  int size() const;

  // True once the engine's thread has stopped (a fault, a stall shutdown, a
  // peer's shutdown): every later submit fails with RuntimeFault. To go on,
  // shut the runtime down and initialise it again (all ranks, as always).
  bool stopped() const;

  // out may equal in (in place). Shapes must match across ranks.
  Handle allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                         const RequestOptions& options = {});
  // First dimension may differ per rank; the output (sum of first dims x rest)
  // is allocated through `allocate` once every rank's shape is known. In
  // place: `in` may be this rank's own rows of the output (the output's start
  // plus the earlier ranks' rows), as ZeRO's allgather into a flat buffer does.
  Handle allgather_async(const std::string& name, const TensorView& in, AllocateOutput allocate,
                         const RequestOptions& options = {});
  // In place on `buffer`; options.root is the source.
  Handle broadcast_async(const std::string& name, const TensorView& buffer,
                         const RequestOptions& options = {});
  // The first dimension of `in` is split across the ranks of the set as evenly
  // as possible (the first `rows % n` ranks get one more row); this rank's
  // reduced rows are written to `out`, of shape reducescatter_shape(...).
  // `out` may be the start of `in` (in place).
  Handle reducescatter_async(const std::string& name, const TensorView& in, const TensorView& out,
                             const RequestOptions& options = {});
  // splits[k] rows of `in` go to rank k (empty = equal split, first dim must
  // divide); the output is allocated once the received rows are known.
  Handle alltoall_async(const std::string& name, const TensorView& in,
                        const std::vector<int64_t>& splits, AllocateOutput allocate,
                        const RequestOptions& options = {});

  // Synchronous forms: submit and wait.
  void allreduce(const std::string& name, const TensorView& in, const TensorView& out,
                 const RequestOptions& options = {});
  void broadcast(const std::string& name, const TensorView& buffer,
                 const RequestOptions& options = {});

  // Shape of this rank's reducescatter output for an input of `shape` in a
  // set of `set_size` ranks where this rank has index `set_rank`.
  static std::vector<int64_t> reducescatter_shape(const std::vector<int64_t>& shape, int set_size,
                                                  int set_rank);

  // This rank has run out of data: until every rank has joined, it keeps
  // taking part in the others' collectives, contributing the neutral element
  // (zeros to sums, no rows to allgathers; averages divide by the ranks that
  // contributed). Blocks until all ranks joined; returns the last rank to join.
  int join(int process_set = 0);

  // Creates a process set of the given world ranks; every world rank must call
  // it with the same ranks (as with Horovod's add_process_set). Using a set on
  // a rank outside it is a ContractError.
  ProcessSet add_process_set(const std::vector<int>& ranks);
  // A set this engine knows (0 = every rank), answered locally: every rank
  // learnt every set's members when it was added. ContractError naming the
  // known sets for an unknown id.
  ProcessSet process_set(int id) const;
  void remove_process_set(int process_set);

  // Current tuning (after autotune has settled, the chosen values).
  double cycle_time_ms() const;
  int64_t fusion_threshold_bytes() const;

  // Counters for tests and benchmarks.
  struct Stats {
    uint64_t cycles = 0;
    uint64_t responses = 0;          // requests completed
    uint64_t collectives = 0;        // communicator calls made for them (fusion lowers this)
    uint64_t cache_hits = 0;         // requests agreed through the bit vector
    uint64_t full_negotiations = 0;  // cycles that exchanged request lists
    uint64_t cache_evictions = 0;
  };
  Stats stats() const;

 private:
  struct KOLO_HIDDEN Impl;
  std::unique_ptr<Impl> impl_;
};

// An engine of this rank alone (a one-rank world of the threads backend; no
// store, no other process): every collective completes with this rank's own
// data. For a parameter-server worker in mode async or ssp, whose own
// collectives (metric averages, a Trainer's) must never wait for another
// worker that may be frozen or restarting.
std::unique_ptr<Engine> make_solo_engine(const EngineOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
