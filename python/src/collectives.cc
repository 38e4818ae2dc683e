// Collectives on torch tensors from Python: the asynchronous forms of
// kolo/torch/tensor.h, one Handle type for all of them, and the byte-level
// helpers kolo.torch's object functions are built on. Synchronous and
// autograd forms, Horovod's argument names and the global-rank roots are
// Python (python/kolo/torch/mpi_ops.py); the collectives themselves are
// kolo_torch's.
//
// Arguments: `process_set` is an id from add_process_set (0 = all ranks),
// `root` a rank of that set, `op` a ReduceOp (kolo/core/dtype.h).
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "kolo/core/errors.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/tensor.h"

namespace kolo::python {
namespace {

// One asynchronous request, or a group of them (grouped_*), as Python sees
// it: poll() and wait() act on every part; wait() returns what the
// operation returns in Horovod (a tensor, a list of them, alltoall's output
// and received splits, or None for join-like requests).
class Handle {
 public:
  enum class Result {
    kTensor,    // the one part's tensor
    kList,      // every part's tensor, in order
    kAlltoall,  // (output, received splits as an int32 tensor), with or without splits
  };

  Handle(std::vector<TensorHandle> parts, Result result)
      : parts_(std::move(parts)), result_(result) {}

  bool poll() const {
    for (const TensorHandle& part : parts_) {
      if (!part.poll()) return false;
    }
    return true;
  }

  // Waits for every part (all of them, even after one failed, so that no
  // request is left running on tensors Python may reuse), then rethrows the
  // first error. A second wait() after success returns None, as Horovod's
  // synchronize() does for a handle it no longer knows.
  py::object wait(std::optional<double> timeout_seconds) {
    if (finished_) return py::none();
    std::vector<torch::Tensor> tensors;
    std::exception_ptr error;
    {
      py::gil_scoped_release release;
      const std::chrono::milliseconds timeout =
          timeout_seconds
              ? std::chrono::milliseconds(static_cast<int64_t>(*timeout_seconds * 1000.0 + 0.5))
              : std::chrono::milliseconds{0};  // 0 = no limit (kolo/core/engine.h)
      for (const TensorHandle& part : parts_) {
        try {
          tensors.push_back(part.wait(timeout));
        } catch (const TimeoutError&) {
          // The request keeps going: the handle stays usable.
          std::rethrow_exception(std::current_exception());
        } catch (...) {
          if (!error) error = std::current_exception();
          tensors.emplace_back();
        }
      }
    }
    finished_ = true;
    if (error) std::rethrow_exception(error);
    switch (result_) {
      case Result::kTensor:
        return py::cast(tensors.at(0));
      case Result::kList:
        return py::cast(tensors);
      case Result::kAlltoall: {
        const std::vector<int64_t> splits = parts_.at(0).received_splits();
        torch::Tensor received =
            torch::tensor(std::vector<int32_t>(splits.begin(), splits.end()), torch::kInt);
        return py::make_tuple(tensors.at(0), received);
      }
    }
    return py::none();
  }

 private:
  std::vector<TensorHandle> parts_;
  Result result_;
  bool finished_ = false;
};

TensorOpOptions options_for(int process_set, int op = 0, double prescale = 1.0,
                            double postscale = 1.0, int root = 0) {
  TensorOpOptions o;
  o.process_set = process_set;
  o.op = reduce_op(op);
  o.prescale = prescale;
  o.postscale = postscale;
  o.root = root;
  return o;
}

// A grouped request: tensor i goes to the engine as "<name>.<i>" through
// `submit` (with the GIL released), and one Handle waits for all of them.
using SubmitOne = std::function<TensorHandle(const torch::Tensor&, const std::string&)>;
Handle submit_group(const std::vector<torch::Tensor>& tensors, const py::object& name,
                    const char* op, const SubmitOne& submit) {
  if (tensors.empty()) {
    throw ContractError(std::string("kolo.torch.") + op + ": the list of tensors is empty");
  }
  const std::string base = request_name(name, op);
  py::gil_scoped_release release;
  std::vector<TensorHandle> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    parts.push_back(submit(tensors[i], base + "." + std::to_string(i)));
  }
  return Handle(std::move(parts), Handle::Result::kList);
}

}  // namespace

ReduceOp reduce_op(int op) {
  // Horovod's numbering (horovod/common/basics.py): Average 0, Sum 1,
  // Adasum 2, Min 3, Max 4, Product 5.
  switch (op) {
    case 0:
      return ReduceOp::kAverage;
    case 1:
      return ReduceOp::kSum;
    case 3:
      return ReduceOp::kMin;
    case 4:
      return ReduceOp::kMax;
    case 5:
      return ReduceOp::kProduct;
    case 2:
      throw ContractError(
          "kolo.torch: op=Adasum is not supported by kolo; use Average (the default) or Sum");
    default:
      break;
  }
  throw ContractError("kolo.torch: op=" + std::to_string(op) +
                      " is not a reduction; use kolo.torch.Average, Sum, Min, Max or Product");
}

void bind_collectives(py::module_& m) {
  py::class_<Handle>(m, "Handle",
                     "An asynchronous collective (or a group of them): pass it to "
                     "kolo.torch.poll() or kolo.torch.synchronize().")
      .def("poll", &Handle::poll, "True once every part finished (never blocks).")
      .def("wait", &Handle::wait, py::arg("timeout_seconds") = py::none(),
           "Blocks until finished; rethrows the request's error; returns its result.");

  m.def(
      "allreduce_async",
      [](const torch::Tensor& tensor, const py::object& name, int op, double prescale,
         double postscale, int process_set, bool in_place) {
        const std::string n = request_name(name, "allreduce");
        const TensorOpOptions o = options_for(process_set, op, prescale, postscale);
        py::gil_scoped_release release;
        TensorHandle h = in_place ? allreduce_async_(tensor, n, o) : allreduce_async(tensor, n, o);
        return Handle({std::move(h)}, Handle::Result::kTensor);
      },
      py::arg("tensor"), py::arg("name"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
      py::arg("process_set"), py::arg("in_place"));

  m.def(
      "grouped_allreduce_async",
      [](const std::vector<torch::Tensor>& tensors, const py::object& name, int op, double prescale,
         double postscale, int process_set, bool in_place) {
        const TensorOpOptions o = options_for(process_set, op, prescale, postscale);
        return submit_group(tensors, name, "grouped_allreduce", [&](auto& t, auto& n) {
          return in_place ? allreduce_async_(t, n, o) : allreduce_async(t, n, o);
        });
      },
      py::arg("tensors"), py::arg("name"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
      py::arg("process_set"), py::arg("in_place"));

  m.def(
      "allgather_async",
      [](const torch::Tensor& tensor, const py::object& name, int process_set) {
        const std::string n = request_name(name, "allgather");
        const TensorOpOptions o = options_for(process_set);
        py::gil_scoped_release release;
        return Handle({allgather_async(tensor, n, o)}, Handle::Result::kTensor);
      },
      py::arg("tensor"), py::arg("name"), py::arg("process_set"));

  m.def(
      "grouped_allgather_async",
      [](const std::vector<torch::Tensor>& tensors, const py::object& name, int process_set) {
        const TensorOpOptions o = options_for(process_set);
        return submit_group(tensors, name, "grouped_allgather",
                            [&](auto& t, auto& n) { return allgather_async(t, n, o); });
      },
      py::arg("tensors"), py::arg("name"), py::arg("process_set"));

  m.def(
      "broadcast_async",
      [](const torch::Tensor& tensor, int root, const py::object& name, int process_set,
         bool in_place) {
        const std::string n = request_name(name, "broadcast");
        const TensorOpOptions o = options_for(process_set, 0, 1.0, 1.0, root);
        py::gil_scoped_release release;
        TensorHandle h = in_place ? broadcast_async_(tensor, n, o) : broadcast_async(tensor, n, o);
        return Handle({std::move(h)}, Handle::Result::kTensor);
      },
      py::arg("tensor"), py::arg("root"), py::arg("name"), py::arg("process_set"),
      py::arg("in_place"));

  m.def(
      "alltoall_async",
      [](const torch::Tensor& tensor, std::optional<std::vector<int64_t>> splits,
         const py::object& name, int process_set) {
        const std::string n = request_name(name, "alltoall");
        const TensorOpOptions o = options_for(process_set);
        py::gil_scoped_release release;
        return Handle({alltoall_async(tensor, splits.value_or(std::vector<int64_t>{}), n, o)},
                      Handle::Result::kAlltoall);
      },
      py::arg("tensor"), py::arg("splits"), py::arg("name"), py::arg("process_set"));

  m.def(
      "reducescatter_async",
      [](const torch::Tensor& tensor, const py::object& name, int op, double prescale,
         double postscale, int process_set) {
        const std::string n = request_name(name, "reducescatter");
        const TensorOpOptions o = options_for(process_set, op, prescale, postscale);
        py::gil_scoped_release release;
        return Handle({reducescatter_async(tensor, n, o)}, Handle::Result::kTensor);
      },
      py::arg("tensor"), py::arg("name"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
      py::arg("process_set"));

  m.def(
      "grouped_reducescatter_async",
      [](const std::vector<torch::Tensor>& tensors, const py::object& name, int op, double prescale,
         double postscale, int process_set) {
        const TensorOpOptions o = options_for(process_set, op, prescale, postscale);
        return submit_group(tensors, name, "grouped_reducescatter",
                            [&](auto& t, auto& n) { return reducescatter_async(t, n, o); });
      },
      py::arg("tensors"), py::arg("name"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
      py::arg("process_set"));

  // --- Bytes: the ground of broadcast_object, allgather_object and
  // broadcast_optimizer_state (pickling is Python's).

  m.def(
      "broadcast_from_root",
      [](const py::function& produce, int root, const std::string& name, int process_set) {
        const TensorOpOptions o = options_for(process_set, 0, 1.0, 1.0, root);
        std::string bytes;
        {
          py::gil_scoped_release release;
          bytes = broadcast_from_root(
              [&produce]() -> std::string {
                py::gil_scoped_acquire acquire;
                try {
                  return produce().cast<std::string>();
                } catch (py::error_already_set& e) {
                  // The message reaches the other ranks; a Python exception
                  // of kolo's kinds keeps its kind.
                  rethrow_as_kolo_error(e);
                }
              },
              name, o);
        }
        return py::bytes(bytes);
      },
      py::arg("produce"), py::arg("root"), py::arg("name"), py::arg("process_set"),
      "Root calls produce() -> bytes; every rank of the set returns root's bytes. If "
      "produce raises on root, every rank raises (root its own exception).");

  m.def(
      "allgather_bytes",
      [](const std::string& bytes, const std::string& name, int process_set) {
        CallOptions o;
        o.process_set = process_set;
        std::vector<std::string> all;
        {
          py::gil_scoped_release release;
          all = allgather_bytes(bytes, name, o);
        }
        py::list out;
        for (const std::string& b : all) out.append(py::bytes(b));
        return out;
      },
      py::arg("bytes"), py::arg("name"), py::arg("process_set"));

  m.def(
      "agree_on_outcome",
      [](const std::string& local_error, const std::string& op, const std::string& name,
         int process_set) {
        CallOptions o;
        o.process_set = process_set;
        agree_on_outcome(local_error, op, name, o);
      },
      py::arg("local_error"), py::arg("op"), py::arg("name"), py::arg("process_set"),
      py::call_guard<py::gil_scoped_release>(),
      "If any rank's local_error is not empty, every rank raises ContractError naming the "
      "ranks and their messages.");

  m.def(
      "broadcast_parameters",
      [](const std::vector<std::pair<std::string, torch::Tensor>>& named, int root,
         int process_set) {
        CallOptions o;
        o.process_set = process_set;
        broadcast_parameters(named, root, o);
      },
      py::arg("named_tensors"), py::arg("root"), py::arg("process_set"),
      py::call_guard<py::gil_scoped_release>(),
      "kolo::broadcast_parameters: every tensor becomes root's, after a check that every rank "
      "holds the same names, dtypes and shapes.");
}

}  // namespace kolo::python
