// Worker started by mpirun (tests/integration/mpi_backend_test.cc): builds the
// mpi communicator from OpenMPI's rank variables and runs the shared
// collective correctness matrix on it.
//
//   mpi_collectives_worker             full matrix; prints each mismatch, exit 1 on any
//   mpi_collectives_worker --mismatch  rank 1 calls allreduce with a different count;
//                                      every rank prints the ContractError, exit 3
//   mpi_collectives_worker --late-peer rank 1 calls 2 s late, timeouts are 1 s: each
//                                      rank that calls prints its TimeoutError, exit 4
//   mpi_collectives_worker --p2p       the shared point-to-point check; as the matrix
//   mpi_collectives_worker --p2p-mismatch  rank 0 sends 1000 f32 to rank 1, which
//                                      receives 999: both print the ContractError, then a
//                                      correct transfer succeeds; exit 3
// Exit 2: an unexpected exception (printed).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collective_check.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "p2p_check.h"

namespace {

int env_int(const char* name, const char* fallback_name) {
  const char* value = std::getenv(name);
  if (value == nullptr) value = std::getenv(fallback_name);
  return value == nullptr ? -1 : std::atoi(value);
}

int run_matrix(kolo::Communicator& comm) {
  const std::vector<std::string> failures =
      kolo::testing::check_collectives(comm, kolo::testing::CheckMatrix{});
  for (const auto& line : failures) std::printf("rank %d: FAIL %s\n", comm.rank(), line.c_str());
  std::printf("rank %d: %zu mismatches\n", comm.rank(), failures.size());
  return failures.empty() ? 0 : 1;
}

int run_mismatch(kolo::Communicator& comm) {
  std::vector<float> data(1000, 1.0f);
  const size_t count = comm.rank() == 1 ? 999 : 1000;
  try {
    comm.allreduce(data.data(), data.data(), count, kolo::DType::kF32, {});
    std::printf("rank %d: no error for a count mismatch\n", comm.rank());
    return 1;
  } catch (const kolo::ContractError& error) {
    std::printf("rank %d: ContractError: %s\n", comm.rank(), error.what());
    std::fflush(stdout);
  }
  // The communicator stays usable: every rank has printed before any exits
  // (mpirun stops the job at the first non-zero exit).
  comm.barrier({});
  return 3;
}

int run_p2p(kolo::Communicator& comm) {
  const std::vector<std::string> failures = kolo::testing::check_point_to_point(comm);
  for (const auto& line : failures) std::printf("rank %d: FAIL %s\n", comm.rank(), line.c_str());
  std::printf("rank %d: %zu mismatches\n", comm.rank(), failures.size());
  comm.barrier({});
  return failures.empty() ? 0 : 1;
}

int run_p2p_mismatch(kolo::Communicator& comm) {
  std::vector<float> data(1000, 1.0f);
  kolo::P2POptions options;
  options.tag = 4;
  if (comm.rank() < 2) {
    try {
      if (comm.rank() == 0) comm.send(data.data(), 1000, kolo::DType::kF32, 1, options);
      if (comm.rank() == 1) comm.recv(data.data(), 999, kolo::DType::kF32, 0, options);
      std::printf("rank %d: no error for a count mismatch\n", comm.rank());
      return 1;
    } catch (const kolo::ContractError& error) {
      std::printf("rank %d: ContractError: %s\n", comm.rank(), error.what());
    }
    float x = 7.0f;
    if (comm.rank() == 0) comm.send(&x, 1, kolo::DType::kF32, 1, options);
    if (comm.rank() == 1) {
      x = 0.0f;
      comm.recv(&x, 1, kolo::DType::kF32, 0, options);
      std::printf("rank 1: after the mismatch received %g\n", x);
    }
  }
  std::fflush(stdout);
  comm.barrier({});
  return 3;
}

// Rank 1 arrives 2 s late with a 1 s timeout on every rank: the others get a
// TimeoutError and exit without MPI_Finalize, so mpirun ends the job (rank 1
// would get one too, in the collective the others abandoned, if it lived).
int run_late_peer(kolo::Communicator& comm) {
  std::vector<float> data(1000, 1.0f);
  kolo::AllreduceOptions options;
  options.timeout = std::chrono::milliseconds(1000);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  try {
    comm.allreduce(data.data(), data.data(), data.size(), kolo::DType::kF32, options);
    std::printf("rank %d: allreduce with a late peer succeeded\n", comm.rank());
    return 1;
  } catch (const kolo::TimeoutError& error) {
    std::printf("rank %d: TimeoutError: %s\n", comm.rank(), error.what());
    return 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  kolo::CommunicatorOptions options;
  options.rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  options.size = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  options.timeout = std::chrono::seconds(60);
  if (options.rank < 0 || options.size < 1) {
    std::printf("mpi_collectives_worker: run me under mpirun (no OMPI_COMM_WORLD_RANK/SIZE)\n");
    return 2;
  }
  try {
    auto comm = kolo::make_communicator("mpi", options);
    const int code = mode == "--mismatch"       ? run_mismatch(*comm)
                     : mode == "--late-peer"    ? run_late_peer(*comm)
                     : mode == "--p2p"          ? run_p2p(*comm)
                     : mode == "--p2p-mismatch" ? run_p2p_mismatch(*comm)
                                                : run_matrix(*comm);
    std::fflush(stdout);
    return code;
  } catch (const std::exception& error) {
    std::printf("rank %d: unexpected exception: %s\n", options.rank, error.what());
    std::fflush(stdout);
    return 2;
  }
}
