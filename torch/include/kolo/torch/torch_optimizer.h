// kolo::TorchOptimizer: one of kolo's data-parallel optimizers
// (ParallelOptimizer: DistributedOptimizer, ZeroOptimizer) as a
// torch::optim::Optimizer, for code that takes one: a training loop written
// against libtorch's interface, libtorch's learning-rate schedulers
// (torch::optim::StepLR), a helper of one's own.
//
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
//   kolo::DistributedOptimizer distributed(sgd, *model);
//   kolo::TorchOptimizer optimizer(distributed);
//   torch::optim::StepLR schedule(optimizer, /*step_size=*/10, /*gamma=*/0.5);
//   torch::optim::Optimizer& plain = optimizer;
//   plain.zero_grad();  loss.backward();  plain.step();  schedule.step();
//
// step() is the parallel step: the gradient exchange, then the wrapped
// optimizer's step. param_groups() hold the wrapped optimizer's parameters
// (at ZeRO stages this rank's pieces, as ParallelOptimizer::optimizer()'s);
// their learning rates are kept in step with the wrapped optimizer's both
// ways at every step(): a rate set here (a scheduler) is the rate of the next
// step, and so is one set on the wrapped optimizer. Their other options are
// the wrapped optimizer's when this was built.
//
// zero_grad() is libtorch's own (it is not virtual there): it clears the
// gradients (2.x: sets them to none, which the gradient pipeline takes as new
// gradients to copy into its buckets; 1.13: zeroes them) without
// ParallelOptimizer::zero_grad()'s check for an exchange still running, so
// call it between a step() and the next backward pass, as usual. save() and
// load() (torch::save of the optimizer) are ContractErrors: the state lives in
// the wrapped optimizer, across ranks at ZeRO stages; kolo::save_checkpoint
// saves it. A step with a loss closure (LBFGS) is a ContractError.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <vector>

#include "kolo/torch/parallel_optimizer.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class TorchOptimizer : public torch::optim::Optimizer {
 public:
  // `parallel` must outlive this. ContractError when it wraps no
  // torch::optim::Optimizer (a synchronize-only DistributedOptimizer, a
  // parameter-server worker).
  explicit TorchOptimizer(ParallelOptimizer& parallel);

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  ParallelOptimizer& parallel() { return parallel_; }

 private:
  // The learning rate of each group, agreed between this and the wrapped
  // optimizer: whichever side changed since the last agreement wins.
  void agree_on_learning_rates();

  ParallelOptimizer& parallel_;
  std::vector<double> agreed_lr_;  // per group
};

}  // namespace kolo
#pragma GCC visibility pop
