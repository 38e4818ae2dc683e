// kolo._kolo: the extension module behind kolo.torch (bindings.h).
#include <torch/python.h>

#include "bindings.h"

PYBIND11_MODULE(_kolo, m) {
  // torch first: its Python types (torch.Tensor) must be registered before
  // a tensor crosses the boundary.
  pybind11::module_::import("torch");
  m.doc() = "kolo's engine and libtorch frontend, bound for kolo.torch (docs/python.md)";
  m.attr("__version__") = KOLO_VERSION_STRING;
  kolo::python::bind_errors(m);
  kolo::python::bind_runtime(m);
  kolo::python::bind_collectives(m);
  kolo::python::bind_elastic(m);
  kolo::python::bind_sampler(m);
  kolo::python::bind_optimizer(m);
  kolo::python::bind_zero(m);
}
