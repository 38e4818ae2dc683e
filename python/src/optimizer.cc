// The gradient exchange under kolo.torch.DistributedOptimizer: kolo's C++
// DistributedOptimizer in its synchronize-only form (kolo/torch/optimizer.h),
// for an optimizer kolo does not see (a Python torch.optim one).
//
// Its constructor registers C++ hooks on every parameter's AccumulateGrad
// node: inside backward() each gradient joins a bucket the moment autograd
// has accumulated it, and a full bucket goes to the engine from the hook,
// with no Python code per gradient. synchronize() waits for the exchange
// (GIL released); the Python optimizer then steps. Python keeps Horovod's
// surface (python/kolo/torch/optimizer.py): the dynamic subclass of the
// optimizer's class, skip_synchronize(), naming the optimizer's parameters.
#include "kolo/torch/optimizer.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "kolo/core/errors.h"

namespace kolo::python {

void bind_optimizer(py::module_& m) {
  py::class_<DistributedOptimizer>(
      m, "GradientExchange",
      "kolo::DistributedOptimizer without a wrapped optimizer: C++ hooks hand each gradient "
      "to the engine in buckets during backward(); synchronize() waits for them.")
      .def(py::init([](const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                       int op, const std::string& compression, int backward_passes_per_step,
                       double gradient_predivide_factor, int process_set, int64_t bucket_bytes,
                       const std::string& name_prefix) {
             DistributedOptimizerOptions options;
             options.op = reduce_op(op);  // Average or Sum, checked by kolo
             options.compression = parse_compression(compression);
             options.backward_passes_per_step = backward_passes_per_step;
             options.gradient_predivide_factor = gradient_predivide_factor;
             options.process_set = process_set;
             if (bucket_bytes >= 0) options.bucket_bytes = bucket_bytes;
             options.name_prefix = name_prefix;
             py::gil_scoped_release release;  // collective: checks against rank 0
             return std::make_unique<DistributedOptimizer>(named_parameters, options);
           }),
           py::arg("named_parameters"), py::arg("op"), py::arg("compression"),
           py::arg("backward_passes_per_step"), py::arg("gradient_predivide_factor"),
           py::arg("process_set"), py::arg("bucket_bytes"), py::arg("name_prefix"))
      .def("synchronize", &DistributedOptimizer::synchronize,
           py::call_guard<py::gil_scoped_release>(),
           "Launches the buckets backward() did not complete, waits for every exchange; "
           "afterwards every .grad holds the reduced gradient.")
      .def("zero_grad", &DistributedOptimizer::zero_grad, py::call_guard<py::gil_scoped_release>(),
           "Zeroes the gradients (as torch's zero_grad(set_to_none=False)) and restarts local "
           "accumulation; ContractError while an exchange started by backward() is unwaited.")
      .def("gradient_names", &DistributedOptimizer::gradient_names)
      .def("buckets", &DistributedOptimizer::buckets)
      .def("stats", [](const DistributedOptimizer& o) {
        const DistributedOptimizer::Stats s = o.stats();
        py::dict out;
        out["steps"] = s.steps;
        out["hook_submissions"] = s.hook_submissions;
        out["step_submissions"] = s.step_submissions;
        out["zero_filled"] = s.zero_filled;
        return out;
      });
}

}  // namespace kolo::python
