// The default runtime from Python: init and shutdown, where this process
// sits, what was compiled in, process sets, join and barrier
// (kolo/core/runtime.h, kolo/core/engine.h).
#include "kolo/core/runtime.h"

#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "kolo/core/communicator.h"
#include "kolo/core/device.h"
#include "kolo/core/elastic.h"
#include "kolo/core/errors.h"
#include "kolo/torch/c10d_store.h"
#include "kolo/torch/tensor.h"

namespace kolo::python {
namespace {

int64_t noname_requests = 0;  // guarded by the GIL
int64_t generation = 0;       // guarded by the GIL

}  // namespace

std::string request_name(const py::object& name, const char* op) {
  if (!name.is_none()) {
    if (!py::isinstance<py::str>(name)) {
      throw ContractError(std::string("kolo.torch.") + op + ": name must be a str (or None), got " +
                          std::string(py::str(py::type::of(name).attr("__name__"))) + " " +
                          std::string(py::repr(name)));
    }
    return name.cast<std::string>();
  }
  return std::string(op) + ".noname." + std::to_string(noname_requests++);
}

void reset_request_names() { noname_requests = 0; }

int64_t runtime_generation() { return generation; }
void next_runtime_generation() { ++generation; }

void bind_runtime(py::module_& m) {
  m.def(
      "init",
      [](std::optional<std::string> backend, std::optional<double> timeout_seconds) {
        elastic::RunOptions options;
        options.init.backend = backend;
        if (timeout_seconds) {
          if (!(*timeout_seconds > 0)) {
            throw ContractError("kolo.torch.init: timeout_seconds is " +
                                std::to_string(*timeout_seconds) + "; it must be > 0");
          }
          options.init.timeout =
              std::chrono::milliseconds(static_cast<int64_t>(*timeout_seconds * 1000.0 + 0.5));
        }
        {
          py::gil_scoped_release release;
          // Under torchrun (>= 2.4) the workers join its agent's c10d store.
          options.init = with_launcher_store(options.init);
          elastic::init(options);
        }
        reset_request_names();
        next_runtime_generation();
      },
      py::arg("backend") = py::none(), py::arg("timeout_seconds") = py::none(),
      "kolo::elastic::init(): kolo::init() (rank and size from kolorun, mpirun, srun or "
      "torchrun variables, joining torchrun's agent store; a world of one without them), or under "
      "kolorun's elastic mode the "
      "first world this worker joins. ContractError if already initialised.");
  m.def("shutdown", &shutdown, py::call_guard<py::gil_scoped_release>(),
        "kolo::shutdown(): stops the engine and closes the communicators. Does nothing if "
        "not initialised.");
  m.def("is_initialized", &is_initialized);
  m.def("cuda_compiled", &cuda_compiled,
        "Whether this build of kolo has its CUDA path (staging and NCCL for CUDA tensors).");
  m.def("nccl_version", &nccl_version,
        "The loadable NCCL's version code (22809 for 2.28.9); 0 without CUDA, NCCL or a GPU.");
  m.def(
      "engine_stopped", [] { return is_initialized() && runtime().engine_stopped(); },
      "Runtime::engine_stopped: initialised, but the engine stopped after a fault (a peer's "
      "shutdown, a stall shutdown, a dead peer); false when not initialised.");
  m.def("rank", &rank);
  m.def("size", &size);
  m.def("local_rank", &local_rank);
  m.def("local_size", &local_size);
  m.def("cross_rank", &cross_rank);
  m.def("cross_size", &cross_size);
  m.def("is_homogeneous", &is_homogeneous);
  m.def(
      "backend", [] { return std::string(runtime().world().backend()); },
      "The world's backend: \"shm\", \"gloo\" or \"mpi\".");
  m.def("compiled_backends", &compiled_backends,
        "Backends compiled into this build (\"shm\", \"gloo\", \"mpi\").");
  m.def("runtime_generation", &runtime_generation,
        "Counts the runtimes this process has used (init() and elastic rounds).");

  m.def(
      "add_process_set",
      [](const std::vector<int>& ranks) { return runtime().engine().add_process_set(ranks).id(); },
      py::arg("ranks"), py::call_guard<py::gil_scoped_release>(),
      "Engine::add_process_set: collective over every world rank; returns the set's id.");
  m.def(
      "remove_process_set", [](int id) { runtime().engine().remove_process_set(id); },
      py::arg("process_set"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "join", [](int process_set) { return runtime().engine().join(process_set); },
      py::arg("process_set") = 0, py::call_guard<py::gil_scoped_release>(),
      "Engine::join: blocks until every rank of the set joined; returns the last one.");
  m.def(
      "barrier",
      [](int process_set) {
        CallOptions options;
        options.process_set = process_set;
        barrier(options);
      },
      py::arg("process_set") = 0, py::call_guard<py::gil_scoped_release>());
}

}  // namespace kolo::python
