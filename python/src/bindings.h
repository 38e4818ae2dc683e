// The _kolo extension behind kolo.torch (docs/python.md): one file per
// concern, each adding its part of the module. Everything here binds the C++
// layers (kolo_core, kolo_torch); the Horovod-shaped API on top is Python
// (python/kolo/torch), and the engine is the same one C++ programs use.
//
// The GIL. Every function that talks to the engine or to other ranks
// releases the GIL while it runs: the engine's thread may need the GIL
// itself (dropping the last reference to a tensor whose Python object is
// still alive takes it), so holding it while waiting for the engine could
// deadlock, and other Python threads keep running meanwhile. Callbacks into
// Python (elastic state, train functions, producers of bytes) take it back.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kolo/core/dtype.h"

namespace kolo::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_runtime(py::module_& m);
void bind_collectives(py::module_& m);
void bind_elastic(py::module_& m);
void bind_optimizer(py::module_& m);
void bind_zero(py::module_& m);
void bind_sampler(py::module_& m);

// Horovod's op values (Average 0, Sum 1, Adasum 2, Min 3, Max 4, Product 5)
// as kolo's ReduceOp; ContractError for Adasum (not supported) and others.
ReduceOp reduce_op(int op);

// A Python exception raised inside a callback that C++ called (an elastic
// train function, a state's serialiser) becomes the kolo error it stands for
// (kolo.RuntimeFault and its alias HorovodInternalError -> RuntimeFault,
// kolo.ContractError -> ContractError, kolo.MembershipChanged ->
// elastic::MembershipChanged), so that C++ callers such as elastic::run
// react to it as to their own. Any other exception is rethrown unchanged.
// Call with the GIL held.
[[noreturn]] void rethrow_as_kolo_error(py::error_already_set& error);

// Request names. Horovod lets every collective go unnamed; kolo's engine
// matches requests across ranks by name, so an unnamed request gets
// "<op>.noname.<n>", n counting this process's unnamed requests since the
// last init (every rank issues them in the same order, as Horovod requires).
std::string request_name(const py::object& name, const char* op);
void reset_request_names();

// Counts the default runtimes this process has used: init() and every
// elastic round after the first. Python objects bound to one runtime's
// engine (DistributedOptimizer) compare it to know they must rebind.
int64_t runtime_generation();
void next_runtime_generation();

}  // namespace kolo::python
