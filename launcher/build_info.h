// `kolorun --check-build`: what this build of kolo contains.
#pragma once

#include <string>

namespace kolo::launcher {

// The listing printed by --check-build, in the style of `horovodrun --check-build`:
// kolo's version, whether the libtorch frontend was built and against which
// libtorch, and the communicator backends compiled into the core
// (kolo::compiled_backends()) with their libraries' versions: gloo's as found
// at build time, the MPI library's as loaded now (MPI_Get_library_version).
std::string check_build_text();

// "kolorun (kolo) 0.2.0".
std::string version_text();

}  // namespace kolo::launcher
