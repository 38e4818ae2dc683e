// Start every rank from the same state: broadcast a model's parameters and
// buffers and an optimizer's state from a root rank (Horovod's
// broadcast_parameters / broadcast_optimizer_state).
//
// Both are collective: every rank of the process set calls them with the same
// root. Afterwards the tensors are bitwise identical on every rank. A model
// or optimizer that differs in structure between ranks (names, shapes,
// dtypes, parameter groups) is a ContractError on every rank, naming what
// differs; no rank is left waiting.
#pragma once

#include <c10/util/Exception.h>  // ordered_dict.h uses TORCH_CHECK without including it
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "kolo/torch/tensor.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// Overwrites every parameter and buffer of `module` (recursively) with
// root's, in a deterministic order: named_parameters() then named_buffers(),
// in registration order. Buffers include e.g. BatchNorm's running statistics
// and counters. Tensors need not be contiguous (they are staged through a
// contiguous copy). Requests are named "broadcast_parameters/<name>".
void broadcast_parameters(const torch::nn::Module& module, int root,
                          const CallOptions& options = {});

// The same for an explicit list of named tensors (e.g. module.named_parameters()).
void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& named_tensors,
                          int root, const CallOptions& options = {});
void broadcast_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& named_tensors,
                          int root, const CallOptions& options = {});

// Makes every rank's optimizer state and parameter-group options (lr,
// momentum, betas, weight decay ...) equal to root's: root serialises its
// optimizer (Optimizer::save plus each group's options), the bytes are
// broadcast, the other ranks clear their state and load them. State that root
// created lazily (Adam's step and moments exist only after the first step)
// appears on the others too; state that only a non-root rank had is dropped.
// Works for SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS and any optimizer that
// implements save/load. The parameters themselves are not sent: broadcast
// them with broadcast_parameters.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root,
                               const CallOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
