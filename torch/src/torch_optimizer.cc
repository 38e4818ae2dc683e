// kolo::TorchOptimizer (torch_optimizer.h): a ParallelOptimizer behind
// libtorch's optimizer interface.
#include "kolo/torch/torch_optimizer.h"

#include <string>

#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"
#include "kolo/torch/lr.h"

namespace kolo {
namespace {

constexpr const char* kOp = "kolo::TorchOptimizer";

// The wrapped optimizer, whose groups and defaults this one starts from.
torch::optim::Optimizer& wrapped(ParallelOptimizer& parallel) { return parallel.optimizer(); }

}  // namespace

TorchOptimizer::TorchOptimizer(ParallelOptimizer& parallel)
    : torch::optim::Optimizer(wrapped(parallel).param_groups(),
                              wrapped(parallel).defaults().clone()),
      parallel_(parallel) {
  compat::keep_group_options(*this, parallel_.optimizer().param_groups());
  for (size_t g = 0; g < param_groups().size(); ++g) {
    agreed_lr_.push_back(current_lr(parallel_.optimizer(), g));
  }
}

void TorchOptimizer::agree_on_learning_rates() {
  torch::optim::Optimizer& inner = parallel_.optimizer();
  if (inner.param_groups().size() != param_groups().size()) {
    throw ContractError(std::string(kOp) + ": the wrapped optimizer has " +
                        std::to_string(inner.param_groups().size()) +
                        " parameter groups, this one " + std::to_string(param_groups().size()) +
                        "; add groups to the wrapped optimizer before building a TorchOptimizer");
  }
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const double mine = current_lr(*this, g);
    const double theirs = current_lr(inner, g);
    if (mine != agreed_lr_[g]) {
      apply_lr(inner, g, mine);
      agreed_lr_[g] = mine;
    } else if (theirs != agreed_lr_[g]) {
      apply_lr(*this, g, theirs);
      agreed_lr_[g] = theirs;
    }
  }
}

torch::Tensor TorchOptimizer::step(LossClosure closure) {
  if (closure) {
    throw ContractError(std::string(kOp) +
                        "::step: a loss closure (LBFGS) cannot run across ranks; compute the "
                        "loss and call backward() before step()");
  }
  agree_on_learning_rates();
  torch::Tensor result = parallel_.step();
  agree_on_learning_rates();
  return result;
}

void TorchOptimizer::save(torch::serialize::OutputArchive&) const {
  throw ContractError(std::string(kOp) +
                      ": torch::save of the optimizer would write only this rank's copy of the "
                      "options; save with kolo::save_checkpoint (the model, the wrapped "
                      "optimizer's state and the training state, across ranks)");
}

void TorchOptimizer::load(torch::serialize::InputArchive&) {
  throw ContractError(std::string(kOp) +
                      ": torch::load into the optimizer is not supported; load with "
                      "kolo::load_checkpoint");
}

}  // namespace kolo
