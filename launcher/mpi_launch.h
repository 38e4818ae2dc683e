// `kolorun --backend mpi`: the job is handed to mpirun.
//
// MPI ranks must be started by MPI's own launcher (a process that calls
// MPI_Init without it is a world of one), so kolorun execs mpirun with the
// equivalent options instead of spawning the workers itself. mpirun then owns
// output, failure propagation and signals (it also stops every rank when one
// fails and exits non-zero). --rank0-only has no mpirun equivalent and is refused.
#pragma once

#include <string>
#include <vector>

#include "hosts.h"
#include "options.h"
#include "worker_env.h"

namespace kolo::launcher {

// mpirun's path chosen at build time (MPIEXEC_EXECUTABLE), or "mpirun".
std::string default_mpirun();

// The mpirun argv equivalent to `options` (argv[0] = `mpirun`):
//   mpirun [-np N] (--host h:s,... | --oversubscribe) --bind-to none
//          [--tag-output] [--output-filename DIR] [--timeout S]
//          -x KOLO_BACKEND=mpi [-x KOLO_TIMEOUT_SECONDS=T] [-x OMP_NUM_THREADS=k ...]
//          [-x NAME ...] program args...
// Thread variables (cores / np) are added only when every rank is local and the
// parent environment does not set them. Throws UsageError for --rank0-only.
std::vector<std::string> mpirun_command(const LaunchOptions& options,
                                        const std::vector<HostSlots>& hosts,
                                        const std::string& mpirun, int local_cores,
                                        const std::vector<std::string>& parent_environ,
                                        const ParentEnv& parent);

}  // namespace kolo::launcher
