// The collective correctness matrix, shared by every test tier: ranks as
// threads (tests/collectives), forked processes (tests/multiproc) and workers
// started by kolorun or mpirun (tests/workers).
//
// Inputs are a deterministic function of (seed, rank, index, dtype), so each
// rank computes the expected result of every collective locally, in double
// precision, with no extra communication. Results are compared with a tolerance
// per dtype (exact for integers and for min/max).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"

namespace kolo::testing {

struct CheckMatrix {
  std::vector<size_t> counts = {0, 1, 7, 1000, (size_t{1} << 20) + 3};
  std::vector<DType> dtypes = {DType::kU8,  DType::kI8,   DType::kI16, DType::kI32, DType::kI64,
                               DType::kF16, DType::kBF16, DType::kF32, DType::kF64};
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                               ReduceOp::kProduct};
  bool in_place = true;       // also run the in-place variant of each collective
  bool scale_factors = true;  // also run allreduce with prescale/postscale != 1
  // Collectives to run: any of "allreduce", "allgather", "allgatherv", "broadcast",
  // "reducescatter", "alltoall", "alltoallv", "barrier".
  std::vector<std::string> collectives = {"allreduce",     "allgather", "allgatherv", "broadcast",
                                          "reducescatter", "alltoall",  "alltoallv",  "barrier"};
  // Counts above this are only run with f32 and f16 sum (keeps big sizes cheap).
  size_t full_matrix_max_count = 1000;
  unsigned seed = 1;
};

// Runs the matrix on `comm` (every rank calls it with the same matrix) and
// returns one line per mismatch ("allreduce f32 sum count=7 in_place: rank 1
// index 3: got 2.5 expected 3.5"), empty when all passed. Collective errors
// propagate as exceptions.
std::vector<std::string> check_collectives(Communicator& comm, const CheckMatrix& matrix);

}  // namespace kolo::testing
