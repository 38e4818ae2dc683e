// --check-build and --version texts (build_info.h).
#include "build_info.h"

#include <algorithm>
#include <vector>

#include "comm/backends.h"
#include "kolo/core/communicator.h"
#include "kolo/version.h"

namespace kolo::launcher {

std::string version_text() { return std::string("kolorun (kolo) ") + kolo::version(); }

std::string check_build_text() {
  const std::vector<std::string> compiled = compiled_backends();
  auto built = [&](const std::string& name) {
    return std::find(compiled.begin(), compiled.end(), name) != compiled.end();
  };
  auto mark = [](bool yes) { return std::string(yes ? "    [X] " : "    [ ] "); };
  // "gloo 0.5.0 (...)" when built, "gloo (...)" otherwise.
  auto backend = [&](const std::string& name, const std::string& what) {
    std::string version = built(name) ? detail::backend_library_version(name) : "";
    return mark(built(name)) + name + (version.empty() ? "" : " " + version) + " (" + what + ")\n";
  };
  std::string text = "kolo v" + std::string(kolo::version()) + ":\n\n";
  text += "Available Frameworks:\n";
#ifdef KOLO_TORCH_VERSION
  text += mark(true) + "libtorch " + KOLO_TORCH_VERSION + " (kolo::torch, libkolo_torch)\n\n";
#else
  text += mark(false) + "libtorch (kolo::torch was not built: libtorch-dev was not found)\n\n";
#endif
  text += "Available Launchers:\n";
  text += mark(true) + "kolorun " + kolo::version() +
          " (local fork/exec and ssh, TCP rendezvous store)\n";
  text += mark(built("mpi")) + "mpirun (kolorun --backend mpi delegates to it)\n\n";
  text += "Available Communicator Backends:\n";
  text += backend("shm", "intra-host shared memory");
  text += backend("gloo", "TCP, Debian libgloo");
  text += backend("mpi", "MPI library");
  return text;
}

}  // namespace kolo::launcher
