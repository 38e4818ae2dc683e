// Where libtorch's C++ API differs between the versions kolo supports (1.13 to
// 2.x, cmake/KoloTorch.cmake checks the range): the one place that knows.
// Everything else in kolo, and a program that wants the same on both, calls
// these instead of the version's own API.
//
//   optimizer state keys   1.13: std::string of the TensorImpl's address
//                          2.x:  the TensorImpl's address (void*)
//   grad_accumulator()     1.13: std::shared_ptr<Node>; 2.x: c10::intrusive_ptr<Node>
//   autocast state         1.13: at::autocast::{is_cpu_enabled, set_cpu_enabled,
//                          get/set_autocast_cpu_dtype} and {is,set}_enabled,
//                          get/set_autocast_gpu_dtype for CUDA; 2.4+: the
//                          device-generic {is,set}_autocast_enabled /
//                          {get,set}_autocast_dtype
//
// Behaviour that changed without an API change, and how kolo meets it:
//   group options          2.x's Optimizer replaces a param group's options of a
//                          type outside torch::optim by the defaults
//                          (keep_group_options below restores them)
//   zero_grad()            since 2.0 Optimizer::zero_grad() and Module::zero_grad()
//                          default to set_to_none=true (undefined .grad()), where
//                          1.13's Optimizer zeroed in place. kolo's optimizers zero
//                          in place on both (zero_grad_in_place below), so that the
//                          gradients stay in their buckets; the gradient pipeline
//                          treats an undefined gradient as zeros and a new one as
//                          a copy.
//   c10::optional          is std::optional in 2.x; kolo uses std::optional.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <string>
#include <utility>
#include <vector>

#pragma GCC visibility push(default)

namespace kolo::compat {

// libtorch's version, as numbers (torch/version.h).
inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// The device-generic autocast calls came with 2.4.
#define KOLO_TORCH_DEVICE_GENERIC_AUTOCAST \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

// The key type of torch::optim::Optimizer::state().
using OptimizerStateKey = typename std::decay_t<
    decltype(std::declval<const torch::optim::Optimizer&>().state())>::key_type;

namespace detail {
inline std::string state_key(void* impl, std::string* /*type*/) { return c10::str(impl); }
inline void* state_key(void* impl, void** /*type*/) { return impl; }
}  // namespace detail

// The key under which torch::optim optimizers (and kolo's LARS/LAMB, which
// follow them) keep the state of parameter `t`.
inline OptimizerStateKey optimizer_state_key(const torch::Tensor& t) {
  return detail::state_key(t.unsafeGetTensorImpl(), static_cast<OptimizerStateKey*>(nullptr));
}

// The smart pointer grad_accumulator() returns: holding one keeps the
// AccumulateGrad node (and the hooks on it) alive across backward passes.
using NodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

// Zeroes every gradient of `optimizer` in place (detach_() and zero_(), the
// tensors stay where they are: kolo's bucket views), as 1.13's zero_grad()
// did; 2.x's zero_grad() would set them to none instead.
inline void zero_grad_in_place(torch::optim::Optimizer& optimizer) {
#if TORCH_VERSION_MAJOR >= 2
  optimizer.zero_grad(/*set_to_none=*/false);
#else
  optimizer.zero_grad();
#endif
}

// Gives each parameter group of `optimizer` the options of the same group of
// `given` (the groups it was constructed from), where `given` has options.
// libtorch 2.x's Optimizer constructor (add_param_group) merges a group's
// options with the defaults only for torch::optim's own optimizers and
// replaces any other type (kolo's LARS and LAMB) by the defaults; 1.13 kept
// them. An optimizer outside torch::optim calls this in its constructor.
inline void keep_group_options(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::optim::OptimizerParamGroup>& given) {
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size() && g < given.size(); ++g) {
    if (given[g].has_options()) groups[g].set_options(given[g].options().clone());
  }
}

// Autocast state of a device type (kCPU or kCUDA): the region's enable flag
// and its lower-precision dtype.
inline bool autocast_enabled(c10::DeviceType device) {
#if KOLO_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}
inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if KOLO_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if KOLO_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if KOLO_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace kolo::compat

#pragma GCC visibility pop
