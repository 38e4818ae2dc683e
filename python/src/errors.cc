// kolo's two kinds of error as Python exceptions (docs/errors.md,
// docs/python.md), and the way back for exceptions raised in Python
// callbacks.
//
//   RuntimeError
//   └── kolo.Error
//       ├── kolo.ContractError  (also a ValueError, as Horovod's argument errors)
//       ├── kolo.RuntimeFault   (recoverable; kolo.torch.HorovodInternalError is this class)
//       │   └── kolo.TimeoutError
//       └── kolo.MembershipChanged (elastic: a newer world waits; raised by commit())
//
// RuntimeFault carries failed_ranks (a list, empty when unknown) and
// MembershipChanged the round it announces.
#include "kolo/core/errors.h"

#include <pybind11/stl.h>

#include <exception>
#include <string>
#include <vector>

#include "bindings.h"
#include "kolo/core/elastic.h"

namespace kolo::python {
namespace {

// The exception classes, created once with the module (never freed: they
// live as long as the interpreter holds the module).
struct Classes {
  PyObject* error = nullptr;
  PyObject* contract = nullptr;
  PyObject* fault = nullptr;
  PyObject* timeout = nullptr;
  PyObject* membership = nullptr;
};
Classes classes;

PyObject* new_class(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("kolo.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));
  return cls;
}

// Raises `cls(message)` with extra attributes set on the instance.
void raise(PyObject* cls, const char* message, const py::dict& attributes = py::dict()) {
  py::object instance = py::reinterpret_borrow<py::object>(cls)(py::str(message));
  for (auto item : attributes) py::setattr(instance, item.first, item.second);
  PyErr_SetObject(cls, instance.ptr());
}

py::dict fault_attributes(const RuntimeFault& fault) {
  py::dict attributes;
  attributes["failed_ranks"] = py::cast(fault.failed_ranks());
  return attributes;
}

std::string message_of(const py::error_already_set& error) {
  return py::str(error.value()).cast<std::string>();
}

std::vector<int> failed_ranks_of(const py::error_already_set& error) {
  py::object ranks = py::getattr(error.value(), "failed_ranks", py::none());
  if (ranks.is_none()) return {};
  try {
    return ranks.cast<std::vector<int>>();
  } catch (const py::cast_error&) {
    return {};
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  py::object runtime_error = py::module_::import("builtins").attr("RuntimeError");
  py::object value_error = py::module_::import("builtins").attr("ValueError");
  classes.error =
      new_class(m, "Error", "Base class of the errors kolo raises.", py::make_tuple(runtime_error));
  py::handle error(classes.error);
  classes.contract = new_class(
      m, "ContractError",
      "The program broke a rule of the API (bad argument, shapes, dtypes, ops or roots that "
      "differ across ranks, use before init). Every rank taking part gets it; retrying fails "
      "the same way: fix the program.",
      py::make_tuple(error, value_error));
  classes.fault = new_class(
      m, "RuntimeFault",
      "The world failed (a peer died, a socket closed, a timeout). Recoverable: elastic "
      "training catches it and re-forms the world. failed_ranks lists the ranks known to be "
      "gone (empty when unknown). Horovod's HorovodInternalError is this class.",
      py::make_tuple(error));
  classes.timeout = new_class(m, "TimeoutError",
                              "A RuntimeFault raised because an operation did not finish in time.",
                              py::make_tuple(py::handle(classes.fault)));
  classes.membership = new_class(
      m, "MembershipChanged",
      "Elastic training: a newer world waits (workers joined); raised by State.commit() on "
      "every member at the same commit and handled by kolo.torch.elastic.run.",
      py::make_tuple(error));

  py::register_exception_translator([](std::exception_ptr pending) {
    try {
      if (pending) std::rethrow_exception(pending);
    } catch (const elastic::MembershipChanged& e) {
      py::dict attributes;
      attributes["round"] = e.round();
      raise(classes.membership, e.what(), attributes);
    } catch (const TimeoutError& e) {
      raise(classes.timeout, e.what(), fault_attributes(e));
    } catch (const RuntimeFault& e) {
      raise(classes.fault, e.what(), fault_attributes(e));
    } catch (const ContractError& e) {
      raise(classes.contract, e.what());
    } catch (const Error& e) {
      raise(classes.error, e.what());
    }
  });
}

void rethrow_as_kolo_error(py::error_already_set& error) {
  if (error.matches(classes.membership)) {
    int64_t round = 0;
    try {
      round = py::getattr(error.value(), "round", py::int_(0)).cast<int64_t>();
    } catch (const py::cast_error&) {
    }
    throw elastic::MembershipChanged(message_of(error), round);
  }
  if (error.matches(classes.timeout)) throw TimeoutError(message_of(error), failed_ranks_of(error));
  if (error.matches(classes.fault)) throw RuntimeFault(message_of(error), failed_ranks_of(error));
  if (error.matches(classes.contract)) throw ContractError(message_of(error));
  throw;
}

}  // namespace kolo::python
