// mpi backend: collectives through MPI (OpenMPI 4.1 or MPICH).
//
// Each communicator duplicates MPI_COMM_WORLD (with MPI_ERRORS_RETURN, so
// failures come back as codes and become RuntimeFault) and runs every
// collective as its nonblocking form (MPI_Iallreduce, ...) polled with
// MPI_Test, so that each call honours its own timeout (TimeoutError). MPI
// cannot cancel a started collective: after a timeout the communicator is
// unusable, and the buffers of that call may still be written by MPI if the
// late ranks ever arrive.
//
// Reductions: built-in MPI ops on u8/i8/i32/i64/f32/f64. f16/bf16 are reduced
// as f32 and integers with a scale or average as f64 (staged_reduction.h),
// which gives reduce.h's semantics with MPI's own op implementations.
//
// Process-wide MPI state: kolo initialises MPI on first use with
// MPI_THREAD_MULTIPLE requested and at least MPI_THREAD_SERIALIZED required
// (the engine calls collectives from its background thread). MPI cannot be
// initialised twice, so kolo never finalises it when a communicator is
// destroyed; if kolo initialised MPI it registers an atexit handler that calls
// MPI_Finalize (OpenMPI's mpirun reports a process that exits without it as an
// error). The handler cannot end the process: it sets MPI_ERRORS_RETURN first
// and ignores the result. If the application initialised MPI, finalising is
// the application's business. After a fault (a timeout, an MPI error, an
// abort()) the handler does not finalise: MPI_Finalize is collective, and a
// rank that is stalled (stopped, stuck) would hold the survivors in it
// forever. The process then exits without MPI_Finalize, which makes mpirun
// end the whole job (and kill the stalled rank) at once. With
// MPI_THREAD_SERIALIZED, kolo serialises its own MPI calls across
// communicators with a process-wide lock.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/call_scratch.h"
#include "comm/p2p.h"
#include "comm/signature.h"
#include "comm/staged_reduction.h"
#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Largest element count one MPI call takes (its count argument is an int).
constexpr size_t kMaxMpiCount = INT_MAX;
// Waiting polls MPI_Test (MPI progresses only inside MPI calls): back to back
// for kSpinTime (latency), then yielding the core between polls so that an
// oversubscribed peer can run, then, past kYieldTime (a stalled peer or a huge
// buffer), one poll every kIdlePoll.
constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr auto kYieldTime = std::chrono::milliseconds(1000);
constexpr auto kIdlePoll = std::chrono::microseconds(100);

// MPI's process-wide state as kolo sees it. MPI itself is process-global, so
// this is too (function-local static, created on first use).
struct MpiProcess {
  std::mutex mutex;       // guards initialisation
  std::mutex call_mutex;  // serialises MPI calls below MPI_THREAD_MULTIPLE
  bool serialize_calls = false;
  // Some communicator of this process failed: MPI_Finalize may never return.
  std::atomic<bool> faulted{false};
};

MpiProcess& mpi_process() {
  static MpiProcess process;
  return process;
}

// Holds the process-wide call lock when MPI is not fully thread-safe.
class CallLock {
 public:
  CallLock() : process_(mpi_process()) {
    if (process_.serialize_calls) process_.call_mutex.lock();
  }
  ~CallLock() {
    if (process_.serialize_calls) process_.call_mutex.unlock();
  }
  CallLock(const CallLock&) = delete;
  CallLock& operator=(const CallLock&) = delete;

 private:
  MpiProcess& process_;
};

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error " + std::to_string(code);
  }
  return std::string(text, length);
}

// Registered with atexit only when kolo initialised MPI. Never terminates the
// process: errors are returned (and ignored) instead of aborting.
void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (mpi_process().faulted.load()) return;  // see the header comment
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Finalize();
}

void ensure_mpi_initialized() {
  MpiProcess& process = mpi_process();
  std::lock_guard<std::mutex> lock(process.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw ContractError(
        "kolo make_communicator(mpi): MPI has already been finalized in this "
        "process; build kolo's MPI communicators before MPI_Finalize");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      throw RuntimeFault("kolo make_communicator(mpi): MPI_Init_thread failed: " +
                         mpi_error_text(rc));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize_mpi_at_exit);
    if (provided < MPI_THREAD_SERIALIZED) {
      throw ContractError(std::string("kolo make_communicator(mpi): this MPI library provides "
                                      "only ") +
                          thread_level_name(provided) +
                          "; kolo needs at least MPI_THREAD_SERIALIZED because its engine "
                          "calls collectives from a background thread. Use an MPI built with "
                          "thread support, or the gloo backend.");
    }
  } else {
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
      throw ContractError(std::string("kolo make_communicator(mpi): the application "
                                      "initialised MPI with ") +
                          thread_level_name(provided) +
                          "; kolo needs at least MPI_THREAD_SERIALIZED because its engine "
                          "calls collectives from a background thread. Initialise MPI with "
                          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or let kolo "
                          "initialise it.");
    }
  }
  process.serialize_calls = provided < MPI_THREAD_MULTIPLE;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kI8:
      return MPI_INT8_T;
    case DType::kI16:
      return MPI_INT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kF16:
    case DType::kBF16:
      return MPI_UINT16_T;  // moved, never reduced (reductions stage to f32)
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
  }
  throw ContractError("kolo mpi: invalid dtype value " + std::to_string(static_cast<int>(dtype)));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kProduct:
      return MPI_PROD;
  }
  throw ContractError("kolo mpi: invalid reduce op value " + std::to_string(static_cast<int>(op)));
}

// MPI has no 16-bit float ops: f16/bf16 are always reduced as f32.
ReductionPlan mpi_plan(DType dtype, const AllreduceOptions& options) {
  ReductionPlan plan = plan_reduction(dtype, options);
  if (plan.wire == DType::kF16 || plan.wire == DType::kBF16) {
    plan.wire = DType::kF32;
    plan.staged = true;
  }
  return plan;
}

std::vector<int> int_counts(const std::vector<size_t>& counts, const char* op,
                            const char* argument) {
  std::vector<int> result;
  size_t total = 0;
  for (size_t count : counts) {
    total += count;
    if (count > kMaxMpiCount || total > kMaxMpiCount) {
      throw ContractError(std::string("kolo ") + op + " (mpi): " + argument + " adds up to " +
                          std::to_string(total) + " elements; the mpi backend takes at most " +
                          std::to_string(kMaxMpiCount) +
                          " elements per call here (MPI counts are int); split the call");
    }
    result.push_back(static_cast<int>(count));
  }
  return result;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> result(counts.size());
  int offset = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    result[k] = offset;
    offset += counts[k];
  }
  return result;
}

void check_fits(size_t count, const char* op) {
  if (count > kMaxMpiCount) {
    throw ContractError(std::string("kolo ") + op + " (mpi): count " + std::to_string(count) +
                        " exceeds " + std::to_string(kMaxMpiCount) +
                        " elements per rank, the most one MPI call takes (MPI counts are "
                        "int); split the call");
  }
}

// ---- Point to point ----------------------------------------------------------
//
// A transfer posts three nonblocking operations at once on the communicator:
// its P2PFrame to the peer (MPI tag 3t for a send's RTS, 3t + 1 for a
// receive's RTR, t the kolo tag), a receive of the peer's frame, and the data
// as exactly one MPI message of any size (tag 3t + 2; past INT_MAX bytes a
// derived datatype of 1 GiB blocks). MPI matches messages of one tag in order,
// so the k-th transfer's three messages pair up with the peer's k-th; MPI's
// progress engine then moves everything with no further action. Waiting
// compares the frames. A receive posted for fewer bytes than were sent ends
// with MPI_ERR_TRUNCATE (expected then), one for more receives less; either
// way exactly one data message is consumed, so a mismatch leaves the streams
// aligned and the communicator usable (the receive buffer's contents are then
// unspecified).

class MpiCommunicator;

struct MpiP2POp final : P2POp {
  bool test() override;
  void wait() override;
  std::string what() const { return "kolo " + p2p_what(kind, peer, mine.tag); }

  MpiCommunicator* comm = nullptr;  // null once the communicator is gone
  P2PKind kind = P2PKind::kSend;
  int peer = 0;
  P2PFrame mine{};
  P2PFrame theirs{};
  Deadline deadline{milliseconds(0)};
  // frame out, frame in, data
  MPI_Request requests[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  bool truncated = false;                      // the data receive was shorter than the message
  MPI_Datatype data_type = MPI_DATATYPE_NULL;  // a derived type to free, if any
  bool done = false;
  std::exception_ptr error;
};

// Datatype and count of one message of `bytes`.
void bytes_type(size_t bytes, MPI_Datatype* type, int* count, bool* derived) {
  if (bytes <= kMaxMpiCount) {
    *type = MPI_BYTE;
    *count = static_cast<int>(bytes);
    *derived = false;
    return;
  }
  const size_t block = size_t{1} << 30;
  const size_t blocks = bytes / block;
  const size_t rest = bytes % block;
  MPI_Datatype gib = MPI_DATATYPE_NULL, all_blocks = MPI_DATATYPE_NULL;
  MPI_Type_contiguous(static_cast<int>(block), MPI_BYTE, &gib);
  MPI_Type_contiguous(static_cast<int>(blocks), gib, &all_blocks);
  if (rest == 0) {
    *type = all_blocks;
  } else {
    int lengths[2] = {1, static_cast<int>(rest)};
    MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(blocks * block)};
    MPI_Datatype types[2] = {all_blocks, MPI_BYTE};
    MPI_Type_create_struct(2, lengths, offsets, types, type);
    MPI_Type_free(&all_blocks);
  }
  MPI_Type_free(&gib);
  MPI_Type_commit(type);
  *count = 1;
  *derived = true;
}

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(const CommunicatorOptions& options)
      : rank_(options.rank),
        size_(options.size),
        default_timeout_(options.timeout),
        check_args_(options.check_args) {
    ensure_mpi_initialized();
    int world_rank = 0;
    int world_size = 0;
    {
      CallLock lock;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    }
    if (!options.world_ranks.empty() &&
        static_cast<int>(options.world_ranks.size()) != world_size) {
      make_subset(options, world_rank, world_size);
      return;
    }
    if (world_rank != rank_ || world_size != size_) {
      throw ContractError(
          "kolo make_communicator(mpi): options.rank=" + std::to_string(rank_) +
          " and options.size=" + std::to_string(size_) + " but this process is rank " +
          std::to_string(world_rank) + " of an MPI world of " + std::to_string(world_size) +
          ". The mpi backend spans MPI_COMM_WORLD: pass its rank and size (kolo::init does), "
          "launch with mpirun -np " +
          std::to_string(size_) + ", or name a subset's members in options.world_ranks.");
    }
    MPI_Request request = MPI_REQUEST_NULL;
    int rc;
    {
      CallLock lock;
      rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request);
    }
    if (rc != MPI_SUCCESS) {
      throw RuntimeFault("kolo make_communicator(mpi): MPI_Comm_idup failed: " +
                         mpi_error_text(rc));
    }
    wait(request, Deadline(default_timeout_), "make_communicator");
    CallLock lock;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  // A communicator of some world ranks (process sets): built from
  // MPI_COMM_WORLD's group with MPI_Comm_create_group, which only the members
  // call. It has no nonblocking form, so it waits for the members without a
  // timeout (the engine builds sets at the same point on every member).
  void make_subset(const CommunicatorOptions& options, int world_rank, int world_size) {
    const std::vector<int>& ranks = options.world_ranks;
    std::string listed;
    for (int r : ranks) listed += (listed.empty() ? "" : ", ") + std::to_string(r);
    const bool sorted = std::is_sorted(ranks.begin(), ranks.end()) &&
                        std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end();
    if (!sorted || ranks.front() < 0 || ranks.back() >= world_size ||
        static_cast<int>(ranks.size()) != size_ || rank_ < 0 || rank_ >= size_ ||
        ranks[rank_] != world_rank) {
      throw ContractError("kolo make_communicator(mpi): options.world_ranks [" + listed +
                          "] with options.rank=" + std::to_string(rank_) + " and options.size=" +
                          std::to_string(size_) + " does not describe this process (world rank " +
                          std::to_string(world_rank) + " of " + std::to_string(world_size) +
                          "); pass the members' world ranks sorted and unique, size = their "
                          "count, rank = this process's index among them");
    }
    // Tag: distinguishes concurrent group creations; derived from the prefix
    // so that every member uses the same one.
    int tag = 0;
    for (char c : options.prefix) tag = (tag * 31 + static_cast<unsigned char>(c)) & 0x7fff;
    CallLock lock;
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int rc = MPI_Group_incl(world_group, size_, ranks.data(), &group);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm_);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS || comm_ == MPI_COMM_NULL) {
      comm_ = MPI_COMM_NULL;
      throw RuntimeFault("kolo make_communicator(mpi): MPI_Comm_create_group for world ranks [" +
                         listed + "] failed: " + mpi_error_text(rc));
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    close_p2p(/*cancel=*/!finalized);
    if (finalized || comm_ == MPI_COMM_NULL) return;
    CallLock lock;
    MPI_Comm_free(&comm_);  // deferred by MPI until pending operations end
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kAllreduce, size_, in, out, count, &options, 0);
    run(reduce_signature(CollectiveKind::kAllreduce, count, dtype, options), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          const ReductionPlan plan = mpi_plan(dtype, options);
          const size_t wire_bytes = dtype_size(plan.wire);
          const bool copy_needed = plan.staged || options.prescale != 1.0;
          uint8_t* work = plan.staged ? work_.get(count * wire_bytes) : static_cast<uint8_t*>(out);
          if (copy_needed) stage_in(plan, options, in, work, count);
          // In place when staged or copied into out; otherwise in -> out directly.
          const bool in_place = copy_needed || in == out;
          for (size_t done = 0; done < count; done += kMaxMpiCount) {
            const int chunk = static_cast<int>(std::min(kMaxMpiCount, count - done));
            const size_t offset = done * wire_bytes;
            start_and_wait(deadline, "allreduce", [&](MPI_Request* request) {
              return MPI_Iallreduce(
                  in_place ? MPI_IN_PLACE : static_cast<const uint8_t*>(in) + offset, work + offset,
                  chunk, mpi_type(plan.wire), mpi_op(plan.wire_op), comm_, request);
            });
          }
          stage_out(plan, options, work, out, count, size_);
        });
  }

  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    check_local_args(CollectiveKind::kAllgather, size_, in, out, count, nullptr, 0);
    run(plain_signature(CollectiveKind::kAllgather, count, dtype), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          check_fits(count * size_, "allgather");
          const int n = static_cast<int>(count);
          const MPI_Datatype type = mpi_type(dtype);
          const bool in_place =
              in == static_cast<const uint8_t*>(out) + rank_ * count * dtype_size(dtype);
          start_and_wait(deadline, "allgather", [&](MPI_Request* request) {
            return MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, type, out, n, type, comm_,
                                  request);
          });
        });
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    check_counts_arg(CollectiveKind::kAllgatherv, "counts", counts, size_);
    size_t total = 0;
    for (size_t c : counts) total += c;
    check_local_args(CollectiveKind::kAllgatherv, size_, counts[rank_] > 0 ? in : out, out, total,
                     nullptr, 0);
    run(plain_signature(CollectiveKind::kAllgatherv, hash_counts(counts), dtype), options.timeout,
        [&](const Deadline& deadline) {
          if (total == 0) return;
          const std::vector<int> recv_counts = int_counts(counts, "allgatherv", "counts");
          const std::vector<int> offsets = displacements(recv_counts);
          const MPI_Datatype type = mpi_type(dtype);
          const bool in_place =
              in == static_cast<const uint8_t*>(out) + offsets[rank_] * dtype_size(dtype);
          start_and_wait(deadline, "allgatherv", [&](MPI_Request* request) {
            return MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in, recv_counts[rank_], type, out,
                                   recv_counts.data(), offsets.data(), type, comm_, request);
          });
        });
  }

  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    check_local_args(CollectiveKind::kBroadcast, size_, buffer, buffer, count, nullptr,
                     options.root);
    CallSignature sig = plain_signature(CollectiveKind::kBroadcast, count, dtype);
    sig.root = options.root;
    run(sig, options.timeout, [&](const Deadline& deadline) {
      const size_t element_bytes = dtype_size(dtype);
      for (size_t done = 0; done < count; done += kMaxMpiCount) {
        const int chunk = static_cast<int>(std::min(kMaxMpiCount, count - done));
        start_and_wait(deadline, "broadcast", [&](MPI_Request* request) {
          return MPI_Ibcast(static_cast<uint8_t*>(buffer) + done * element_bytes, chunk,
                            mpi_type(dtype), options.root, comm_, request);
        });
      }
    });
  }

  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kReducescatter, size_, in, out, count, &options, 0);
    run(reduce_signature(CollectiveKind::kReducescatter, count, dtype, options), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          check_fits(count, "reducescatter");
          const ReductionPlan plan = mpi_plan(dtype, options);
          const size_t total = count * size_;
          const int n = static_cast<int>(count);
          const MPI_Datatype type = mpi_type(plan.wire);
          const MPI_Op op = mpi_op(plan.wire_op);
          if (!plan.staged && options.prescale == 1.0) {
            // MPI_IN_PLACE: input from `out` (size()*count), result in its first block.
            start_and_wait(deadline, "reducescatter", [&](MPI_Request* request) {
              return MPI_Ireduce_scatter_block(in == out ? MPI_IN_PLACE : in, out, n, type, op,
                                               comm_, request);
            });
            stage_out(plan, options, out, out, count, size_);
            return;
          }
          uint8_t* work = work_.get(total * dtype_size(plan.wire));
          stage_in(plan, options, in, work, total);
          start_and_wait(deadline, "reducescatter", [&](MPI_Request* request) {
            return MPI_Ireduce_scatter_block(MPI_IN_PLACE, work, n, type, op, comm_, request);
          });
          stage_out(plan, options, work, out, count, size_);
        });
  }

  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    check_local_args(CollectiveKind::kAlltoall, size_, in, out, count, nullptr, 0);
    run(plain_signature(CollectiveKind::kAlltoall, count, dtype), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          check_fits(count * size_, "alltoall");
          const size_t bytes = count * size_ * dtype_size(dtype);
          const void* source = in;
          if (in == out) {  // in place: send from a copy
            uint8_t* copy = exchange_copy_.get(bytes);
            std::memcpy(copy, in, bytes);
            source = copy;
          }
          const int n = static_cast<int>(count);
          const MPI_Datatype type = mpi_type(dtype);
          start_and_wait(deadline, "alltoall", [&](MPI_Request* request) {
            return MPI_Ialltoall(source, n, type, out, n, type, comm_, request);
          });
        });
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    check_alltoallv_args(size_, in, send_counts, out, recv_counts);
    const std::vector<int> sends = int_counts(send_counts, "alltoallv", "send_counts");
    const std::vector<int> recvs = int_counts(recv_counts, "alltoallv", "recv_counts");
    run(plain_signature(CollectiveKind::kAlltoallv, 0, dtype), options.timeout,
        [&](const Deadline& deadline) {
          if (check_args_ && size_ > 1) check_alltoallv(send_counts, recv_counts, deadline);
          const std::vector<int> send_offsets = displacements(sends);
          const std::vector<int> recv_offsets = displacements(recvs);
          const MPI_Datatype type = mpi_type(dtype);
          start_and_wait(deadline, "alltoallv", [&](MPI_Request* request) {
            return MPI_Ialltoallv(in, sends.data(), send_offsets.data(), type, out, recvs.data(),
                                  recv_offsets.data(), type, comm_, request);
          });
        });
  }

  P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(P2PKind::kSend, const_cast<void*>(data), count, dtype, peer, options);
  }

  P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(P2PKind::kRecv, data, count, dtype, peer, options);
  }

  // Moves `op` along; true once it finished (its outcome recorded in it).
  bool p2p_test(MpiP2POp& op) {
    if (op.done) return true;
    for (int i = 0; i < 3; ++i) {
      if (op.requests[i] == MPI_REQUEST_NULL) continue;
      int finished = 0;
      MPI_Status status;
      int rc;
      {
        CallLock lock;
        rc = MPI_Test(&op.requests[i], &finished, &status);
      }
      if (rc == MPI_ERR_IN_STATUS) rc = status.MPI_ERROR;
      if (i == 2 && op.kind == P2PKind::kRecv && rc == MPI_ERR_TRUNCATE) {
        op.truncated = true;  // a mismatch; the frames say which
        op.requests[i] = MPI_REQUEST_NULL;
        continue;
      }
      if (rc != MPI_SUCCESS) {
        p2p_finish(op, std::make_exception_ptr(p2p_fault(op, mpi_error_text(rc))));
        return true;
      }
    }
    for (MPI_Request request : op.requests) {
      if (request != MPI_REQUEST_NULL) return false;
    }
    const std::string problem = frame_problem(op.theirs);
    if (!problem.empty()) {
      p2p_finish(op, std::make_exception_ptr(p2p_fault(
                         op, "rank " + std::to_string(op.peer) +
                                 " sent a corrupt point-to-point frame (" + problem + ")")));
      return true;
    }
    const std::string mismatch = p2p_mismatch(op.kind, rank_, op.peer, op.mine, op.theirs);
    p2p_finish(op, mismatch.empty() ? nullptr : std::make_exception_ptr(ContractError(mismatch)));
    return true;
  }

  void p2p_wait(MpiP2POp& op) {
    const auto start = Clock::now();
    for (unsigned polls = 1; !p2p_test(op); ++polls) {
      if (polls % 16 != 0) continue;
      const auto now = Clock::now();
      if (op.deadline.passed(now)) {
        const std::string message =
            op.what() + " (mpi): timed out after " + std::to_string(op.deadline.timeout().count()) +
            " ms on rank " + std::to_string(rank_) + ": rank " + std::to_string(op.peer) +
            " did not take part (it skipped the matching call, is stuck, or died); the "
            "communicator is unusable";
        fault_ = "timed out after " + std::to_string(op.deadline.timeout().count()) + " ms";
        mpi_process().faulted.store(true);  // no collective MPI_Finalize at exit
        p2p_cancel(op);
        p2p_finish(op, std::make_exception_ptr(TimeoutError(message, {op.peer})));
        break;
      }
      const auto waited = now - start;
      if (waited > kYieldTime) {
        std::this_thread::sleep_for(kIdlePoll);
      } else if (waited > kSpinTime) {
        sched_yield();
      }
    }
    if (op.error) std::rethrow_exception(op.error);
  }

  // The communicator goes away: pending transfers fail (and their MPI
  // requests are cancelled while MPI is still there).
  void close_p2p(bool cancel) {
    for (auto& weak : p2p_pending_) {
      auto op = weak.lock();
      if (!op) continue;
      op->comm = nullptr;
      if (op->done) continue;
      if (cancel) p2p_cancel(*op);
      op->done = true;
      op->error = std::make_exception_ptr(RuntimeFault(
          op->what() + ": the communicator was destroyed while the transfer was pending"));
      if (cancel && op->data_type != MPI_DATATYPE_NULL) MPI_Type_free(&op->data_type);
    }
    p2p_pending_.clear();
  }

  void barrier(const CollectiveOptions& options) override {
    CallSignature sig;
    sig.kind = CollectiveKind::kBarrier;
    run(sig, options.timeout, [&](const Deadline& deadline) {
      start_and_wait(deadline, "barrier",
                     [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
    });
  }

 private:
  P2PHandle post_p2p(P2PKind kind, void* data, size_t count, DType dtype, int peer,
                     const P2POptions& options) {
    check_p2p_args(kind, rank_, size_, peer, data, count, dtype, options);
    const std::string name = "kolo " + p2p_what(kind, peer, options.tag);
    if (!fault_.empty()) {
      throw RuntimeFault(name + " (mpi): the communicator is unusable after an earlier fault (" +
                         fault_ + "); destroy it and build a new one");
    }
    check_tag_fits(options.tag, name);
    const bool send = kind == P2PKind::kSend;
    auto op = std::make_shared<MpiP2POp>();
    op->comm = this;
    op->kind = kind;
    op->peer = peer;
    op->mine = make_frame(send ? P2PFrame::kRts : P2PFrame::kRtr, options.tag,
                          p2p_sequences_.next(kind, peer, options.tag), count, dtype);
    op->deadline = Deadline(options.timeout.count() > 0 ? options.timeout : default_timeout_);
    const int rts = 3 * options.tag, rtr = rts + 1, data_tag = rts + 2;
    int data_count = 0;
    bool derived = false;
    bytes_type(count * dtype_size(dtype), &op->data_type, &data_count, &derived);
    if (!derived) op->data_type = MPI_DATATYPE_NULL;
    const MPI_Datatype type = derived ? op->data_type : MPI_BYTE;
    int rc;
    {
      CallLock lock;
      rc = MPI_Isend(&op->mine, sizeof(P2PFrame), MPI_BYTE, peer, send ? rts : rtr, comm_,
                     &op->requests[0]);
      if (rc == MPI_SUCCESS) {
        rc = MPI_Irecv(&op->theirs, sizeof(P2PFrame), MPI_BYTE, peer, send ? rtr : rts, comm_,
                       &op->requests[1]);
      }
      if (rc == MPI_SUCCESS) {
        rc = send ? MPI_Isend(data, data_count, type, peer, data_tag, comm_, &op->requests[2])
                  : MPI_Irecv(data, data_count, type, peer, data_tag, comm_, &op->requests[2]);
      }
    }
    if (rc != MPI_SUCCESS) {
      const RuntimeFault fault = p2p_fault(*op, mpi_error_text(rc));
      p2p_cancel(*op);
      p2p_finish(*op, nullptr);
      throw fault;
    }
    p2p_pending_.erase(std::remove_if(p2p_pending_.begin(), p2p_pending_.end(),
                                      [](const std::weak_ptr<MpiP2POp>& w) { return w.expired(); }),
                       p2p_pending_.end());
    p2p_pending_.push_back(op);
    return P2PHandle(op);
  }

  // MPI_TAG_UB is at least 32767; Open MPI's and MPICH's are far larger.
  void check_tag_fits(int tag, const std::string& name) {
    void* value = nullptr;
    int found = 0;
    {
      CallLock lock;
      MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
    }
    const long long upper = found ? *static_cast<int*>(value) : 32767;
    if (3LL * tag + 2 > upper) {
      throw ContractError(
          name + " (mpi): tag " + std::to_string(tag) +
          " is too large for this MPI library (MPI_TAG_UB = " + std::to_string(upper) +
          "; kolo uses 3 MPI tags per tag): use a tag <= " + std::to_string((upper - 2) / 3));
    }
  }

  RuntimeFault p2p_fault(const MpiP2POp& op, const std::string& detail) {
    fault_ = detail;
    return RuntimeFault(op.what() + " (mpi, rank " + std::to_string(rank_) + " of " +
                            std::to_string(size_) + "): " + detail + " while rank " +
                            std::to_string(rank_) + " waited for rank " + std::to_string(op.peer) +
                            "; the communicator is unusable",
                        {op.peer});
  }

  // Gives up on whatever of `op` is still pending.
  void p2p_cancel(MpiP2POp& op) {
    CallLock lock;
    for (MPI_Request& request : op.requests) {
      if (request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&request);
      MPI_Request_free(&request);
    }
  }

  void p2p_finish(MpiP2POp& op, std::exception_ptr error) {
    op.done = true;
    op.error = std::move(error);
    if (op.data_type != MPI_DATATYPE_NULL) {
      CallLock lock;
      MPI_Type_free(&op.data_type);
    }
  }

  // One collective: the cross-rank argument check, then `body`.
  template <typename Body>
  void run(CallSignature sig, milliseconds timeout, Body&& body) {
    const char* op = collective_name(sig.kind);
    if (fault_.empty() && abort_requested_.load(std::memory_order_acquire)) aborted();
    if (!fault_.empty()) {
      throw RuntimeFault(std::string("kolo mpi ") + op +
                         ": the communicator is unusable after "
                         "an earlier fault (" +
                         fault_ + "); destroy it and build a new one");
    }
    sig.sequence = sequence_++;
    const Deadline deadline(timeout.count() > 0 ? timeout : default_timeout_);
    if (check_args_ && size_ > 1) {
      std::vector<CallSignature> all(size_);
      start_and_wait(deadline, op, [&](MPI_Request* request) {
        return MPI_Iallgather(&sig, sizeof(CallSignature), MPI_BYTE, all.data(),
                              sizeof(CallSignature), MPI_BYTE, comm_, request);
      });
      check_signatures(all);
    }
    body(deadline);
  }

  // alltoallv counts agree across ranks: send_counts[k] on r == recv_counts[r] on k.
  void check_alltoallv(const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& recv_counts, const Deadline& deadline) {
    std::vector<uint64_t> mine(2 * size_);
    for (int k = 0; k < size_; ++k) {
      mine[k] = send_counts[k];
      mine[size_ + k] = recv_counts[k];
    }
    std::vector<uint64_t> all(2 * size_ * size_);
    start_and_wait(deadline, "alltoallv", [&](MPI_Request* request) {
      return MPI_Iallgather(mine.data(), 2 * size_, MPI_UINT64_T, all.data(), 2 * size_,
                            MPI_UINT64_T, comm_, request);
    });
    std::vector<std::vector<size_t>> sends(size_), recvs(size_);
    for (int r = 0; r < size_; ++r) {
      const uint64_t* row = all.data() + r * 2 * size_;
      sends[r].assign(row, row + size_);
      recvs[r].assign(row + size_, row + 2 * size_);
    }
    check_alltoallv_counts(sends, recvs);
  }

  // Starts one nonblocking MPI operation and waits for it.
  template <typename Start>
  void start_and_wait(const Deadline& deadline, const char* op, Start&& start) {
    MPI_Request request = MPI_REQUEST_NULL;
    int rc;
    {
      CallLock lock;
      rc = start(&request);
    }
    if (rc != MPI_SUCCESS) fail(op, rc);
    wait(request, deadline, op);
  }

  // Polls `request` until done, the deadline passes (TimeoutError) or MPI
  // reports an error (RuntimeFault).
  void wait(MPI_Request& request, const Deadline& deadline, const char* op) {
    const auto start = Clock::now();
    enum class Pace { kSpin, kYield, kIdle } pace = Pace::kSpin;
    for (unsigned polls = 1;; ++polls) {
      int done = 0;
      int rc;
      {
        CallLock lock;
        rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) fail(op, rc);
      if (done) return;
      if (abort_requested_.load(std::memory_order_acquire)) aborted();
      if (polls % 16 == 0) {  // the clock costs more than a poll
        const auto now = Clock::now();
        if (deadline.passed(now)) timed_out(op, deadline);
        const auto waited = now - start;
        pace = waited > kYieldTime ? Pace::kIdle : waited > kSpinTime ? Pace::kYield : Pace::kSpin;
      }
      if (pace == Pace::kYield) sched_yield();
      if (pace == Pace::kIdle) std::this_thread::sleep_for(kIdlePoll);
    }
  }

  // The ranks are unknown: an MPI collective does not say who is missing.
  std::optional<std::vector<int>> waiting_for() const override { return std::nullopt; }

  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (abort_requested_.load()) return true;
      abort_reason_ = reason;
      abort_ranks_ = ranks;
    }
    abort_requested_.store(true, std::memory_order_release);
    return true;
  }

  [[noreturn]] void aborted() {
    // As after a timeout, the request stays pending for good.
    mpi_process().faulted.store(true);
    std::lock_guard<std::mutex> lock(abort_mutex_);
    fault_ = abort_reason_;
    throw RuntimeFault(abort_reason_, abort_ranks_);
  }

  [[noreturn]] void timed_out(const char* op, const Deadline& deadline) {
    // MPI cannot cancel a collective: the request stays pending for good.
    mpi_process().faulted.store(true);
    fault_ = "timed out after " + std::to_string(deadline.timeout().count()) + " ms";
    throw TimeoutError(std::string("kolo mpi ") + op + " (rank " + std::to_string(rank_) + " of " +
                       std::to_string(size_) + "): timed out after " +
                       std::to_string(deadline.timeout().count()) +
                       " ms; some ranks did not make this call in time (MPI does not say "
                       "which); the communicator is unusable");
  }

  [[noreturn]] void fail(const char* op, int rc) {
    mpi_process().faulted.store(true);
    fault_ = mpi_error_text(rc);
    throw RuntimeFault(std::string("kolo mpi ") + op + " (rank " + std::to_string(rank_) + " of " +
                       std::to_string(size_) + "): " + fault_ + "; the communicator is unusable");
  }

  const int rank_;
  const int size_;
  const milliseconds default_timeout_;
  const bool check_args_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  uint64_t sequence_ = 0;
  Scratch work_;           // staged reductions
  Scratch exchange_copy_;  // in-place alltoall
  std::string fault_;      // set once a fault made the communicator unusable
  P2PSequences p2p_sequences_;
  std::vector<std::weak_ptr<MpiP2POp>> p2p_pending_;  // to fail when the communicator goes away
  // abort(), from any thread; read by wait().
  std::atomic<bool> abort_requested_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
  std::vector<int> abort_ranks_;
};

bool MpiP2POp::test() {
  if (done || comm == nullptr) return true;
  return comm->p2p_test(*this);
}

void MpiP2POp::wait() {
  if (!done && comm != nullptr) comm->p2p_wait(*this);
  if (!done) {
    done = true;
    error = std::make_exception_ptr(
        RuntimeFault(what() + ": the communicator was destroyed while the transfer was pending"));
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const CommunicatorOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown version";
  std::string version(text, static_cast<size_t>(std::max(0, length)));
  const size_t end = version.find_first_of(",\n");
  if (end != std::string::npos) version.resize(end);
  return version;
}

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace kolo::detail
