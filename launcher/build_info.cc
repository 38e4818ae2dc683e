// --check-build and --version texts (build_info.h).
#include "build_info.h"

#include <algorithm>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/version.h"

namespace kolo::launcher {

std::string version_text() { return std::string("kolorun (kolo) ") + kolo::version(); }

std::string check_build_text() {
  const std::vector<std::string> compiled = compiled_backends();
  auto mark = [&](const std::string& name) {
    return std::find(compiled.begin(), compiled.end(), name) != compiled.end() ? "[X]" : "[ ]";
  };
  std::string text = "kolo v" + std::string(kolo::version()) + ":\n\n";
  text += "Available Frameworks:\n";
  text += "    [ ] libtorch (not yet: the kolo_torch layer is a later issue)\n\n";
  text += "Available Launchers:\n";
  text += "    [X] kolorun (local fork/exec and ssh, TCP rendezvous store)\n";
  text += std::string("    ") + mark("mpi") + " mpirun (kolorun --backend mpi delegates to it)\n\n";
  text += "Available Communicator Backends:\n";
  text += std::string("    ") + mark("shm") + " shm (intra-host shared memory)\n";
  text += std::string("    ") + mark("gloo") + " gloo (TCP, Debian libgloo)\n";
  text += std::string("    ") + mark("mpi") + " mpi (OpenMPI)\n";
  return text;
}

}  // namespace kolo::launcher
