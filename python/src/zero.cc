// The sharding under kolo.torch.ZeroOptimizer: kolo's C++ ZeroOptimizer
// (kolo/torch/zero.h) at stages 1 and 2, for a Python torch.optim optimizer
// and a Python model, which kolo's C++ code does not see.
//
// The C++ ZeroOptimizer takes a torch::optim::Optimizer and a
// torch::nn::Module. Two small adapters stand in for the Python objects:
//   - ModelView: a torch::nn::Module holding the Python model's parameters
//     (the same tensors, so set_data, which makes each parameter a view of a
//     flat buffer, changes the tensors Python holds) under the same dotted
//     names, as a tree of empty submodules.
//   - StepByPython: a torch::optim::Optimizer with the Python optimizer's
//     parameter groups (parameters only); the ZeroOptimizer replaces them by
//     this rank's pieces, which Python then gives the Python optimizer, and
//     its step() calls back into Python for the Python optimizer's step.
// So the partition, the hooks inside backward(), the reduce-scatter, the
// allgather and the collective checks are the C++ ZeroOptimizer's, and the
// update is the Python optimizer's, on this rank's slices.
#include "kolo/torch/zero.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/python.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "kolo/core/errors.h"

namespace kolo::python {

namespace {

// The Python model's parameters as a torch::nn::Module: "layer1.0.weight" is
// parameter "weight" of submodule "0" of submodule "layer1" (torch's C++
// modules do not take dots in a parameter's name), so named_parameters()
// gives the Python names back.
class ModelView : public torch::nn::Module {
 public:
  explicit ModelView(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters) {
    std::map<std::string, torch::nn::Module*> modules{{"", this}};
    for (const auto& [name, tensor] : named_parameters) {
      torch::nn::Module* owner = this;
      std::string path;
      size_t begin = 0;
      for (size_t dot = name.find('.'); dot != std::string::npos;
           begin = dot + 1, dot = name.find('.', begin)) {
        const std::string part = name.substr(begin, dot - begin);
        path += (path.empty() ? "" : ".") + part;
        auto it = modules.find(path);
        if (it == modules.end()) {
          auto child = owner->register_module(part, std::make_shared<torch::nn::Module>());
          it = modules.emplace(path, child.get()).first;
        }
        owner = it->second;
      }
      // requires_grad as the Python parameter has it (register_parameter sets it).
      owner->register_parameter(name.substr(begin), tensor, tensor.requires_grad());
    }
  }
};

// A torch::optim::Optimizer whose step() is the Python optimizer's. Its
// groups' options are unused placeholders: the Python optimizer holds the
// real ones (lr, betas...) and its own state.
class StepByPython : public torch::optim::Optimizer {
 public:
  StepByPython(const std::vector<std::vector<torch::Tensor>>& groups, py::function step)
      : torch::optim::Optimizer(param_groups_of(groups),
                                std::make_unique<torch::optim::SGDOptions>(0.0)),
        step_(std::move(step)) {}
  ~StepByPython() override {
    py::gil_scoped_acquire gil;
    step_ = py::function();
  }

  torch::Tensor step(LossClosure closure) override {
    py::gil_scoped_acquire gil;  // the ZeroOptimizer's step() runs without it
    step_();
    return {};
  }

 private:
  static std::vector<torch::optim::OptimizerParamGroup> param_groups_of(
      const std::vector<std::vector<torch::Tensor>>& groups) {
    std::vector<torch::optim::OptimizerParamGroup> out;
    for (const auto& params : groups) out.emplace_back(params);
    return out;
  }
  py::function step_;
};

// What Python holds: the adapters and the ZeroOptimizer over them. The
// ZeroOptimizer, which refers to both, goes first, without the GIL: its
// destructor waits for requests still running, and the engine may need the
// GIL meanwhile (bindings.h).
struct PythonZero {
  ~PythonZero() {
    py::gil_scoped_release release;
    zero.reset();
  }
  std::unique_ptr<ModelView> model;
  std::unique_ptr<StepByPython> optimizer;
  std::unique_ptr<ZeroOptimizer> zero;
};

}  // namespace

void bind_zero(py::module_& m) {
  py::class_<PythonZero>(
      m, "ZeroSharding",
      "kolo::ZeroOptimizer (stages 1, 2) over a Python model's parameters and a Python "
      "optimizer's step: pieces() are this rank's slices, which the Python optimizer steps.")
      .def(py::init([](const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                       const std::vector<std::vector<torch::Tensor>>& groups, py::function step,
                       int stage, int backward_passes_per_step, int process_set,
                       int64_t bucket_bytes) {
             auto out = std::make_unique<PythonZero>();
             out->model = std::make_unique<ModelView>(named_parameters);
             out->optimizer = std::make_unique<StepByPython>(groups, std::move(step));
             ZeroOptions options;
             options.stage = stage;
             options.backward_passes_per_step = backward_passes_per_step;
             options.process_set = process_set;
             if (bucket_bytes >= 0) options.bucket_bytes = bucket_bytes;
             py::gil_scoped_release release;  // collective: checks against rank 0
             out->zero = std::make_unique<ZeroOptimizer>(*out->optimizer, *out->model, options);
             return out;
           }),
           py::arg("named_parameters"), py::arg("groups"), py::arg("step"), py::arg("stage"),
           py::arg("backward_passes_per_step"), py::arg("process_set"), py::arg("bucket_bytes"))
      .def(
          "pieces",
          [](PythonZero& z) {
            std::vector<std::vector<torch::Tensor>> out;
            for (const auto& group : z.optimizer->param_groups()) out.push_back(group.params());
            return out;
          },
          "Per parameter group, this rank's pieces (1-D views of its slices), which the "
          "optimizer steps.")
      .def(
          "step", [](PythonZero& z) { z.zero->step(); }, py::call_guard<py::gil_scoped_release>(),
          "Reduce-scatter (what backward() did not start), the Python step on this rank's "
          "pieces, allgather of the updated slices into the parameters.")
      .def(
          "synchronize", [](PythonZero& z) { z.zero->synchronize(); },
          py::call_guard<py::gil_scoped_release>(),
          "Finishes every bucket's reduce-scatter; the pieces' .grad hold the reduced gradients.")
      .def(
          "zero_grad", [](PythonZero& z) { z.zero->zero_grad(); },
          py::call_guard<py::gil_scoped_release>(),
          "Stage 1 zeroes the gradients (views of a flat buffer), stage 2 releases them.")
      .def("buckets",
           [](const PythonZero& z) {
             py::list out;
             for (const auto& b : z.zero->buckets()) {
               py::dict d;
               d["name"] = b.name;
               d["numel"] = b.numel;
               d["shard_begin"] = b.shard_begin;
               d["shard_numel"] = b.shard_numel;
               out.append(d);
             }
             return out;
           })
      .def("memory", [](const PythonZero& z) {
        const ZeroMemory m = z.zero->memory();
        py::dict d;
        d["param_bytes"] = m.param_bytes;
        d["grad_bytes"] = m.grad_bytes;
        d["peak_param_bytes"] = m.peak_param_bytes;
        d["peak_grad_bytes"] = m.peak_grad_bytes;
        return d;
      });
}

}  // namespace kolo::python
