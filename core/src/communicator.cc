// Backend dispatch for make_communicator(), and Communicator's default members.
#include "kolo/core/communicator.h"

#include "comm/backends.h"
#include "comm/hierarchical_communicator.h"
#include "kolo/core/errors.h"

namespace kolo {

void Communicator::allreduce_segments(const std::vector<AllreduceSegment>&, DType,
                                      const AllreduceOptions&) {
  throw ContractError(std::string("kolo allreduce_segments: the ") + backend() +
                      " backend has no native segmented allreduce (native_segments() is false); "
                      "pack the segments into one buffer and call allreduce()");
}

std::vector<std::string> compiled_backends() {
  std::vector<std::string> names = {"shm"};
#if KOLO_HAVE_GLOO
  names.push_back("gloo");
#endif
#if KOLO_HAVE_MPI
  names.push_back("mpi");
#endif
  return names;
}

namespace detail {

std::string backend_library_version(const std::string& backend) {
#if KOLO_HAVE_GLOO && defined(KOLO_GLOO_VERSION)
  if (backend == "gloo") return KOLO_GLOO_VERSION;
#endif
#if KOLO_HAVE_MPI
  if (backend == "mpi") return mpi_library_version();
#endif
  return "";
}

}  // namespace detail

std::unique_ptr<Communicator> make_communicator(const std::string& backend,
                                                const CommunicatorOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw ContractError("kolo make_communicator: rank " + std::to_string(options.rank) +
                        " is not in [0, size=" + std::to_string(options.size) + ")");
  }
  if (options.timeout.count() <= 0) {
    throw ContractError("kolo make_communicator: timeout must be > 0 ms, got " +
                        std::to_string(options.timeout.count()));
  }
  if ((backend == "gloo" || backend == "mpi") && detail::wants_hierarchy(options)) {
    return detail::build_hierarchical_communicator(backend, options);
  }
  if (backend == "shm") return detail::make_shm_communicator(options);
#if KOLO_HAVE_GLOO
  if (backend == "gloo") return detail::make_gloo_communicator(options);
#endif
#if KOLO_HAVE_MPI
  if (backend == "mpi") return detail::make_mpi_communicator(options);
#endif
  std::string list;
  for (const auto& name : compiled_backends()) list += (list.empty() ? "" : ", ") + name;
  throw ContractError("kolo make_communicator: unknown or not compiled-in backend '" + backend +
                      "'; this build has: " + list + " (see kolorun --check-build)");
}

}  // namespace kolo
