// `kolorun --check-build`: what this build of kolo contains.
#pragma once

#include <string>

namespace kolo::launcher {

// The listing printed by --check-build, in the style of `horovodrun --check-build`:
// the version, the frameworks (libtorch: not yet) and the communicator backends
// compiled into libkolo_core (kolo::compiled_backends()).
std::string check_build_text();

// "kolorun (kolo) 0.1.0".
std::string version_text();

}  // namespace kolo::launcher
