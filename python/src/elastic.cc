// Elastic training from Python (kolo/core/elastic.h, docs/elastic.md): the
// C++ State with its serialisation written in Python, and run(), which
// calls a Python train function once per world. Horovod's classes
// (ObjectState, TorchState) and the run decorator are Python
// (python/kolo/torch/elastic); commit, restore, sync, the host-update check
// and the loop over rounds are kolo's.
#include "kolo/core/elastic.h"

#include <pybind11/functional.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo::python {
namespace {

// A State whose subclass (a Python class) provides _serialize() -> bytes and
// _deserialize(bytes). Called from C++ (commit, restore, sync) with the GIL
// released; they take it.
class PythonState : public elastic::State {
 public:
  using elastic::State::State;

 protected:
  Bytes serialize() override {
    py::gil_scoped_acquire acquire;
    py::function method = override_of("_serialize");
    try {
      const std::string bytes = method().cast<std::string>();
      return Bytes(bytes.begin(), bytes.end());
    } catch (py::error_already_set& e) {
      rethrow_as_kolo_error(e);
    }
  }

  void deserialize(const Bytes& bytes) override {
    py::gil_scoped_acquire acquire;
    py::function method = override_of("_deserialize");
    try {
      method(py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    } catch (py::error_already_set& e) {
      rethrow_as_kolo_error(e);
    }
  }

 private:
  py::function override_of(const char* name) {
    py::function method = py::get_override(static_cast<const elastic::State*>(this), name);
    if (!method) {
      throw ContractError(std::string("kolo.torch.elastic.State: the subclass does not define ") +
                          name + "(); derive from ObjectState or TorchState, or define it");
    }
    return method;
  }
};

}  // namespace

void bind_elastic(py::module_& m) {
  py::class_<elastic::State, PythonState>(
      m, "State",
      "kolo::elastic::State: commit(), restore(), sync(root), on_reset(callback); epoch and "
      "batch are part of every commit. Subclasses define _serialize() -> bytes and "
      "_deserialize(bytes).")
      .def(py::init<>())
      .def_readwrite("epoch", &elastic::State::epoch)
      .def_readwrite("batch", &elastic::State::batch)
      .def("commit", &elastic::State::commit, py::call_guard<py::gil_scoped_release>(),
           "Snapshots the state; inside run(), raises MembershipChanged on every member when a "
           "newer world waits.")
      .def("restore", &elastic::State::restore, py::call_guard<py::gil_scoped_release>(),
           "Returns to the last commit (nothing happens before the first).")
      .def("sync", &elastic::State::sync, py::arg("root") = 0,
           py::call_guard<py::gil_scoped_release>(),
           "Every rank takes root's current state (collective).")
      .def(
          "on_reset",
          [](elastic::State& state, const py::function& callback) {
            // Held by pointer: the State keeps a copy of the std::function,
            // whose py::function may only be released with the GIL (the
            // State dies with its Python object, under the GIL).
            auto held = std::make_shared<py::function>(callback);
            state.on_reset([held] {
              py::gil_scoped_acquire acquire;
              try {
                (*held)();
              } catch (py::error_already_set& e) {
                rethrow_as_kolo_error(e);
              }
            });
          },
          py::arg("callback"), "Called after the world was re-formed and the state synced.")
      .def_property_readonly("commit_count", &elastic::State::commit_count)
      .def_property_readonly("round", &elastic::State::round);

  m.def(
      "elastic_mode", [] { return elastic::Rendezvous::enabled(process_env()); },
      "Whether kolorun started this process in elastic mode (KOLO_ELASTIC=1).");
  m.def(
      "elastic_run",
      [](elastic::State& state, const py::function& train) {
        // Every call of `train` after the first is a new runtime, and so is
        // the first if run() initialises the runtime itself.
        const bool initialised = is_initialized();
        int calls = 0;
        py::gil_scoped_release release;
        elastic::run(state, [&] {
          py::gil_scoped_acquire acquire;
          if (calls++ > 0 || !initialised) {
            next_runtime_generation();
            reset_request_names();
          }
          try {
            train();
          } catch (py::error_already_set& e) {
            rethrow_as_kolo_error(e);
          }
        });
      },
      py::arg("state"), py::arg("train"),
      "kolo::elastic::run: calls train() once per world until it returns.");
}

}  // namespace kolo::python
