// Factories of the communicator backends (internal). make_communicator()
// dispatches to these; each lives in its own file under core/src/comm/.
#pragma once

#include <memory>
#include <string>

#include "kolo/core/communicator.h"

namespace kolo::detail {

// Intra-host shared memory (shm_communicator.cc). All ranks on one host.
std::unique_ptr<Communicator> make_shm_communicator(const CommunicatorOptions& options);

#if KOLO_HAVE_GLOO
// TCP through libgloo (gloo_communicator.cc); rendezvous through options.store.
std::unique_ptr<Communicator> make_gloo_communicator(const CommunicatorOptions& options);
#endif

#if KOLO_HAVE_MPI
// OpenMPI / MPICH (mpi_communicator.cc). Initialises MPI once per process with
// MPI_THREAD_SERIALIZED or better (collectives run from the engine's thread).
std::unique_ptr<Communicator> make_mpi_communicator(const CommunicatorOptions& options);
// True when this process was started by an MPI launcher.
bool launched_by_mpi();
// The MPI library's own identification (MPI_Get_library_version, which MPI-3
// allows before MPI_Init), its first line up to the first comma:
// "Open MPI v4.1.4". Initialises nothing.
std::string mpi_library_version();
#endif

#if KOLO_HAVE_CUDA
// NCCL on CUDA device memory of options.device (nccl_communicator.cc). Not a
// world backend: the engine builds one per process set for CUDA tensors
// (engine/device_path.h); make_communicator() does not take "nccl".
std::unique_ptr<Communicator> make_nccl_communicator(const CommunicatorOptions& options);
// The loaded NCCL's version code (22809 for 2.28.9); loads it.
int nccl_version();
#endif

// The version of a compiled-in backend's library, for kolorun --check-build:
// gloo's CMake package version as found at build time ("0.5.0"), the MPI
// library's identification at run time, "" for shm and unknown names.
std::string backend_library_version(const std::string& backend);

}  // namespace kolo::detail
