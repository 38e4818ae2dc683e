// NCCL: collectives on CUDA device memory (backends.h). Built with the CUDA
// toolkit's headers (KOLO_HAVE_CUDA); NCCL itself is loaded at run time
// (cuda/cuda_api.h).
//
// Every pointer handed to this communicator is device memory of
// options.device. Each call enqueues its NCCL operation on the
// communicator's own stream and returns once the stream has finished it,
// which keeps the Communicator contract synchronous. The engine orders the
// input: it waits for the tensor's readiness event before the call
// (kolo/core/device.h).
//
// Timeouts and faults follow kolo's model, not NCCL's default blocking:
// the communicator is created non-blocking (ncclConfig_t::blocking = 0) and
// every wait polls the stream and ncclCommGetAsyncError. A call not finished
// within its timeout, or an abort() from the engine's stall watch, ends in
// ncclCommAbort and TimeoutError / RuntimeFault; an asynchronous NCCL error
// (a peer that died: NCCL reports a remote error) is a RuntimeFault. After
// either the communicator is unusable, as with every backend.
//
// What NCCL cannot do exactly is refused with a ContractError, and the
// engine stages such requests through the host communicator instead
// (engine/device_path.h): int16 reductions (NCCL has no int16), and
// reductions with a prescale or postscale other than 1.
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/nccl_id.h"
#include "cuda/cuda_api.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::detail {

namespace {

using Clock = std::chrono::steady_clock;

bool nccl_dtype(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kU8:
      *out = ncclUint8;
      return true;
    case DType::kI8:
      *out = ncclInt8;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF64:
      *out = ncclFloat64;
      return true;
    case DType::kI16:
      return false;
  }
  return false;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommunicatorOptions& o)
      : cuda_(cuda_api()),
        nccl_(nccl_api()),
        rank_(o.rank),
        size_(o.size),
        device_(o.device),
        timeout_(o.timeout),
        world_ranks_(o.world_ranks) {
    if (!o.store && o.size > 1) {
      throw ContractError("kolo nccl: a communicator of " + std::to_string(o.size) +
                          " ranks needs a store to exchange NCCL's unique id");
    }
    cuda_.use(device_);
    std::string id_bytes;
    auto generate = [this] {
      ncclUniqueId id;
      check(nccl_.GetUniqueId(&id), "ncclGetUniqueId");
      return std::string(id.internal, sizeof id.internal);
    };
    if (o.size == 1) {
      id_bytes = generate();
    } else {
      id_bytes = exchange_nccl_id(*o.store, o.prefix, rank_, timeout_, generate);
    }
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(nccl_.CommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRank");
    // Non-blocking: initialisation completes in the background.
    wait_for_comm("ncclCommInitRank", Clock::now() + timeout_);
    cuda_.check(cuda_.StreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate",
                device_);
  }

  ~NcclCommunicator() override {
    cuda_.SetDevice(device_);
    if (comm_ != nullptr) {  // null once a fault aborted it
      if (broken_) {
        nccl_.CommAbort(comm_);
      } else {
        nccl_.CommDestroy(comm_);
      }
    }
    if (scratch_) cuda_.Free(scratch_);
    if (stream_) cuda_.StreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& o) override {
    const ncclDataType_t type = reduction_type("allreduce", dtype, o);
    run("allreduce", o.timeout,
        [&] { return nccl_.AllReduce(in, out, count, type, nccl_op(o.op), comm_, stream_); });
  }

  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& o) override {
    const size_t bytes = count * dtype_size(dtype);
    // NCCL's in-place allgather has kolo's layout: in == out + rank * count.
    run("allgather", o.timeout,
        [&] { return nccl_.AllGather(in, out, bytes, ncclUint8, comm_, stream_); });
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& o) override {
    check_counts("allgatherv", counts);
    const size_t esize = dtype_size(dtype);
    // One broadcast from each rank into its place in `out`, in one group.
    run("allgatherv", o.timeout, [&] {
      ncclResult_t result = nccl_.GroupStart();
      size_t offset = 0;
      for (int k = 0; k < size_ && result == ncclSuccess; ++k) {
        uint8_t* place = static_cast<uint8_t*>(out) + offset;
        const void* from = k == rank_ ? in : place;
        result = nccl_.Broadcast(from, place, counts[k] * esize, ncclUint8, k, comm_, stream_);
        offset += counts[k] * esize;
      }
      const ncclResult_t end = nccl_.GroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  void broadcast(void* buffer, size_t count, DType dtype, const BroadcastOptions& o) override {
    if (o.root < 0 || o.root >= size_) {
      throw ContractError("kolo nccl broadcast: root " + std::to_string(o.root) +
                          " is not a rank of this communicator of " + std::to_string(size_));
    }
    const size_t bytes = count * dtype_size(dtype);
    run("broadcast", o.timeout,
        [&] { return nccl_.Broadcast(buffer, buffer, bytes, ncclUint8, o.root, comm_, stream_); });
  }

  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& o) override {
    const ncclDataType_t type = reduction_type("reducescatter", dtype, o);
    const size_t bytes = count * dtype_size(dtype);
    if (in != out || rank_ == 0) {
      // NCCL's in-place form writes at in + rank * count: for rank 0 that is
      // kolo's in-place layout (the first count elements) already.
      run("reducescatter", o.timeout,
          [&] { return nccl_.ReduceScatter(in, out, count, type, nccl_op(o.op), comm_, stream_); });
      return;
    }
    // kolo's in place: the result over the first `count` elements of in.
    uint8_t* mine = static_cast<uint8_t*>(out) + rank_ * bytes;
    run("reducescatter", o.timeout, [&] {
      ncclResult_t r = nccl_.ReduceScatter(in, mine, count, type, nccl_op(o.op), comm_, stream_);
      if (r == ncclSuccess && bytes) {
        cuda_.check(cuda_.MemcpyAsync(out, mine, bytes, cudaMemcpyDeviceToDevice, stream_),
                    "cudaMemcpyAsync", device_);
      }
      return r;
    });
  }

  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& o) override {
    std::vector<size_t> counts(size_, count);
    exchange("alltoall", in, counts, out, counts, dtype, o.timeout);
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& o) override {
    check_counts("alltoallv", send_counts);
    check_counts("alltoallv", recv_counts);
    exchange("alltoallv", in, send_counts, out, recv_counts, dtype, o.timeout);
  }

  void barrier(const CollectiveOptions& o) override {
    void* one = scratch(sizeof(int32_t));
    run("barrier", o.timeout,
        [&] { return nccl_.AllReduce(one, one, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

  void send(const void* data, size_t count, DType dtype, int peer, const P2POptions& o) override {
    check_peer("send", peer);
    const size_t bytes = count * dtype_size(dtype);
    run("send", o.timeout,
        [&] { return nccl_.Send(data, bytes, ncclUint8, peer, comm_, stream_); });
  }

  void recv(void* data, size_t count, DType dtype, int peer, const P2POptions& o) override {
    check_peer("recv", peer);
    const size_t bytes = count * dtype_size(dtype);
    run("recv", o.timeout,
        [&] { return nccl_.Recv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }

  std::optional<std::vector<int>> waiting_for() const override { return std::nullopt; }

  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      abort_reason_ = reason;
      abort_ranks_ = ranks;
    }
    aborted_.store(true);
    return true;
  }

 private:
  void check(ncclResult_t result, const char* what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    broken_ = true;
    std::string detail = nccl_.GetErrorString(result);
    if (comm_ != nullptr) {
      const char* last = nccl_.GetLastError(comm_);
      if (last && *last) detail += std::string(": ") + last;
    }
    throw RuntimeFault("kolo nccl: " + std::string(what) + " on rank " + std::to_string(rank_) +
                           " (cuda:" + std::to_string(device_) + ") failed: " + detail,
                       {});
  }

  ncclDataType_t reduction_type(const char* op, DType dtype, const AllreduceOptions& o) const {
    ncclDataType_t type;
    if (!nccl_dtype(dtype, &type)) {
      throw ContractError(std::string("kolo nccl ") + op + ": NCCL has no " + dtype_name(dtype) +
                          " reduction; the engine stages such tensors through the host backend");
    }
    if (o.prescale != 1.0 || o.postscale != 1.0) {
      throw ContractError(std::string("kolo nccl ") + op +
                          ": NCCL reductions take no prescale or postscale factor; the engine "
                          "stages such requests through the host backend");
    }
    return type;
  }

  void check_counts(const char* op, const std::vector<size_t>& counts) const {
    if (static_cast<int>(counts.size()) != size_) {
      throw ContractError(std::string("kolo nccl ") + op + ": " + std::to_string(counts.size()) +
                          " counts for a communicator of " + std::to_string(size_) + " ranks");
    }
  }

  void check_peer(const char* op, int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw ContractError(std::string("kolo nccl ") + op + ": peer " + std::to_string(peer) +
                          " is not another rank of this communicator of " + std::to_string(size_));
    }
  }

  // Device scratch of at least `bytes`, owned by the communicator.
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) cuda_.Free(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      cuda_.check(cuda_.Malloc(&scratch_, bytes), "cudaMalloc", device_);
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  // Grouped sends and receives; in place (in == out) through scratch.
  void exchange(const char* op, const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, DType dtype,
                std::chrono::milliseconds timeout) {
    const size_t esize = dtype_size(dtype);
    size_t send_total = 0;
    for (size_t c : send_counts) send_total += c * esize;
    const void* from = in;
    if (in == out && send_total) {
      void* copy = scratch(send_total);
      cuda_.use(device_);
      cuda_.check(cuda_.MemcpyAsync(copy, in, send_total, cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpyAsync", device_);
      from = copy;
    }
    run(op, timeout, [&] {
      ncclResult_t result = nccl_.GroupStart();
      size_t send_offset = 0, recv_offset = 0;
      for (int k = 0; k < size_ && result == ncclSuccess; ++k) {
        const size_t sb = send_counts[k] * esize, rb = recv_counts[k] * esize;
        if (sb) {
          result = nccl_.Send(static_cast<const uint8_t*>(from) + send_offset, sb, ncclUint8, k,
                              comm_, stream_);
        }
        if (result == ncclSuccess && rb) {
          result = nccl_.Recv(static_cast<uint8_t*>(out) + recv_offset, rb, ncclUint8, k, comm_,
                              stream_);
        }
        send_offset += sb;
        recv_offset += rb;
      }
      const ncclResult_t end = nccl_.GroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  // Enqueues `enqueue` on the stream and waits for it (see the file's comment).
  template <typename F>
  void run(const char* what, std::chrono::milliseconds timeout, F&& enqueue) {
    if (broken_) {
      throw RuntimeFault("kolo nccl " + std::string(what) +
                         ": this communicator failed earlier and is unusable; build a new one");
    }
    cuda_.use(device_);
    const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
    check(enqueue(), what);
    wait_for_comm(what, deadline);
    for (int spins = 0;; ++spins) {
      const cudaError_t state = cuda_.StreamQuery(stream_);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) {
        broken_ = true;
        cuda_.check(state, what, device_);
      }
      poll(what, deadline);
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits while NCCL reports its last call still in progress.
  void wait_for_comm(const char* what, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(nccl_.CommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what);
      poll(what, deadline);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // One step of a wait: an asynchronous error, an abort, or the deadline.
  void poll(const char* what, Clock::time_point deadline) {
    ncclResult_t state = ncclSuccess;
    if (nccl_.CommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress) {
      nccl_.CommAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
      throw RuntimeFault("kolo nccl " + std::string(what) + " on rank " + std::to_string(rank_) +
                             ": NCCL reported " + nccl_.GetErrorString(state) +
                             " (a peer failed or left); the communicator was aborted",
                         {});
    }
    if (aborted_.load()) {
      nccl_.CommAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
      std::lock_guard<std::mutex> lock(abort_mutex_);
      throw RuntimeFault("kolo nccl " + std::string(what) + ": " + abort_reason_, abort_ranks_);
    }
    if (Clock::now() > deadline) {
      nccl_.CommAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
      throw TimeoutError("kolo nccl " + std::string(what) + " on rank " + std::to_string(rank_) +
                         " (cuda:" + std::to_string(device_) + ") did not finish within " +
                         std::to_string(timeout_.count() / 1000) +
                         " s (KOLO_TIMEOUT_SECONDS); the communicator was aborted "
                         "(ncclCommAbort). A rank that never called it, or a hung GPU, is the "
                         "usual cause");
    }
  }

  const CudaApi& cuda_;
  const NcclApi& nccl_;
  const int rank_;
  const int size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::vector<int> world_ranks_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool broken_ = false;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;
  std::vector<int> abort_ranks_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

int nccl_version() { return nccl_api().version; }

}  // namespace kolo::detail
