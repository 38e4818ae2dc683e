// Peers kolo is measured against in the same run (never used by kolo itself).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kolo/core/communicator.h"
#include "kolo/core/store.h"

namespace kolo::bench {

// A raw operation of a fixed size (an f32-sum allreduce, a ping-pong), set up
// once and run repeatedly.
class RawOp {
 public:
  virtual ~RawOp() = default;
  virtual void run() = 0;
};

// Raw MPI_Allreduce on MPI_COMM_WORLD (out of place, MPI_FLOAT, MPI_SUM).
// Null when MPI is not compiled in or this process was not started by mpirun.
std::function<std::unique_ptr<RawOp>(size_t count)> mpi_raw_allreduce_factory();

// A raw MPI ping-pong of `bytes` between world ranks 0 and 1 (MPI_Send then
// MPI_Recv on rank 0, the reverse on rank 1, nothing on the others): run()
// is one round trip. Null when MPI is not compiled in or this process was not
// started by mpirun.
std::function<std::unique_ptr<RawOp>(size_t bytes)> mpi_raw_pingpong_factory();

// Raw gloo::AllreduceRingChunked<float> over a TCP context of its own
// (rendezvous through `store`) whose device binds `address` (loopback when
// every rank is on this host, the host's own address across hosts). Null when
// gloo is not compiled in.
std::function<std::unique_ptr<RawOp>(size_t count)> gloo_raw_allreduce_factory(
    std::shared_ptr<Store> store, int rank, int size, const std::string& address);

// STREAM-like copy bandwidth in GB/s counted read + write (2 * bytes / time),
// single thread, median of repeats.
double memcpy_bandwidth_gbps(size_t bytes);

}  // namespace kolo::bench
