// WatchedCommunicator (internal): a communicator whose blocking
// point-to-point waits a P2PWatch watches (engine/stall_inspector.h);
// everything else is the inner communicator's, forwarded unchanged. The
// Runtime hands these out (world(), group_communicator()): user transfers
// (pipelines, parameter servers, kolo::send/recv) bypass the engine and its
// stall checks, so without it a transfer whose peer never posts the match
// waits silently until its timeout.
//
// Every virtual of Communicator is forwarded; one added there must be added
// here too, or the decorator falls back to the base class's default.
#pragma once

#include <memory>

#include "engine/stall_inspector.h"
#include "kolo/core/communicator.h"
#include "log.h"

namespace kolo::detail {

class WatchedCommunicator final : public Communicator {
 public:
  WatchedCommunicator(std::unique_ptr<Communicator> inner, P2PWatch::Options options,
                      Logger logger);
  ~WatchedCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    inner_->allreduce(in, out, count, dtype, options);
  }
  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    inner_->allgather(in, out, count, dtype, options);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    inner_->allgatherv(in, out, counts, dtype, options);
  }
  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    inner_->broadcast(buffer, count, dtype, options);
  }
  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    inner_->reducescatter(in, out, count, dtype, options);
  }
  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    inner_->alltoall(in, out, count, dtype, options);
  }
  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    inner_->alltoallv(in, send_counts, out, recv_counts, dtype, options);
  }
  void barrier(const CollectiveOptions& options) override { inner_->barrier(options); }
  bool native_segments() const override { return inner_->native_segments(); }
  void allreduce_segments(const std::vector<AllreduceSegment>& segments, DType dtype,
                          const AllreduceOptions& options) override {
    inner_->allreduce_segments(segments, dtype, options);
  }

  // The blocking forms are isend/irecv + wait(), as in the base class, so
  // that their wait is watched too.
  P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override;
  P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override;

  std::optional<std::vector<int>> waiting_for() const override { return inner_->waiting_for(); }
  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    return inner_->abort(reason, ranks);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  // Shared with the handles, which may outlive this communicator.
  std::shared_ptr<P2PWatch> watch_;
};

}  // namespace kolo::detail
