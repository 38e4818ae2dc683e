// Factories of the communicator backends (internal). make_communicator()
// dispatches to these; each lives in its own file under core/src/comm/.
#pragma once

#include <memory>

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
#endif

}  // namespace kolo::detail
