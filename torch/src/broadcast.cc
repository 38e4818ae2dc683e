// Broadcast of parameters and optimizer state (kolo/torch/broadcast.h).
#include "kolo/torch/broadcast.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <sstream>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo {

namespace detail {

std::vector<std::pair<std::string, torch::Tensor>> module_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back("param/" + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    tensors.emplace_back("buffer/" + item.key(), item.value());
  }
  return tensors;
}

std::string tensor_manifest(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::ostringstream out;
  for (const auto& [name, tensor] : tensors) {
    out << name << " ";
    if (!tensor.defined()) {
      out << "undefined\n";
      continue;
    }
    out << c10::toString(tensor.scalar_type()) << " [";
    for (size_t i = 0; i < tensor.sizes().size(); ++i) out << (i ? ", " : "") << tensor.size(i);
    out << "]\n";
  }
  return out.str();
}

std::string manifest_difference(const std::string& expected, const std::string& actual) {
  std::istringstream e(expected);
  std::istringstream a(actual);
  std::string le;
  std::string la;
  for (int line = 1;; ++line) {
    const bool he = static_cast<bool>(std::getline(e, le));
    const bool ha = static_cast<bool>(std::getline(a, la));
    if (!he && !ha) return "";
    if (!he) return "extra tensor " + la + " (tensor #" + std::to_string(line) + ")";
    if (!ha) return "missing tensor " + le + " (tensor #" + std::to_string(line) + ")";
    if (le != la) {
      return "tensor #" + std::to_string(line) + " is " + la + ", expected " + le;
    }
  }
}

}  // namespace detail

namespace {

struct Staged {
  torch::Tensor target;   // the caller's tensor
  torch::Tensor staging;  // contiguous CPU copy broadcast in its place
};

}  // namespace

void broadcast_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& named_tensors,
                          int root, const CallOptions& options) {
  const std::string op = "kolo::broadcast_parameters";
  Engine& engine = engine_of(options, "kolo::broadcast_parameters");
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "broadcast_parameters");

  // Every rank checks its structure against root's, so that a mismatch is an
  // error everywhere instead of a stall on the first differing name.
  const std::string mine = detail::tensor_manifest(named_tensors);
  const std::string roots = detail::broadcast_from_root([&] { return mine; }, root, position,
                                                        "broadcast_parameters.manifest", o);
  std::string difference = detail::manifest_difference(roots, mine);
  if (!difference.empty())
    difference = "differs from root rank " + std::to_string(root) + ": " + difference;
  detail::agree_on_outcome(difference, op, "broadcast_parameters.check", o);

  TensorOpOptions t;
  static_cast<CallOptions&>(t) = o;
  t.root = root;
  std::vector<TensorHandle> handles;
  std::vector<Staged> staged;
  handles.reserve(named_tensors.size());
  for (const auto& [name, tensor] : named_tensors) {
    if (!tensor.defined() || tensor.numel() == 0) continue;
    const std::string request = "broadcast_parameters/" + name;
    if (tensor.device().is_cpu() && tensor.is_contiguous() && tensor.layout() == torch::kStrided) {
      handles.push_back(broadcast_async_(tensor, request, t));
    } else {
      Staged s{tensor, tensor.detach().to(torch::kCPU).contiguous().clone()};
      handles.push_back(broadcast_async_(s.staging, request, t));
      staged.push_back(std::move(s));
    }
  }
  for (const auto& handle : handles) handle.wait(options.timeout);
  torch::NoGradGuard no_grad;
  for (auto& s : staged) s.target.copy_(s.staging);
}

void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& named_tensors,
                          int root, const CallOptions& options) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  tensors.reserve(named_tensors.size());
  for (const auto& item : named_tensors) tensors.emplace_back(item.key(), item.value());
  broadcast_parameters(tensors, root, options);
}

void broadcast_parameters(const torch::nn::Module& module, int root, const CallOptions& options) {
  broadcast_parameters(detail::module_tensors(module), root, options);
}

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root,
                               const CallOptions& options) {
  const std::string op = "kolo::broadcast_optimizer_state";
  Engine& engine = engine_of(options, "kolo::broadcast_optimizer_state");
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "broadcast_optimizer_state");
  const std::string bytes = detail::broadcast_from_root(
      [&] {
        torch::serialize::OutputArchive archive;
        detail::save_optimizer(optimizer, archive);
        return detail::archive_to_bytes(archive);
      },
      root, position, "broadcast_optimizer_state", o);
  std::string error;
  if (position.rank != root) {
    try {
      torch::serialize::InputArchive archive;
      detail::archive_from_bytes(bytes, archive);
      detail::load_optimizer(optimizer, archive,
                             "root rank " + std::to_string(root) + "'s optimizer");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::agree_on_outcome(error, op, "broadcast_optimizer_state.check", o);
}

}  // namespace kolo
