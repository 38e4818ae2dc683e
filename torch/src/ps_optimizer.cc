// kolo::ps::WorkerOptimizer (ps_optimizer.h): a ps::Worker as a ParallelOptimizer.
#include "kolo/torch/ps_optimizer.h"

#include <torch/nn/module.h>

#include "common.h"
#include "kolo/core/errors.h"
#include "kolo/torch/tensor.h"

namespace kolo::ps {

WorkerOptimizer::WorkerOptimizer(Worker& worker, torch::nn::Module& model, const CallOptions& where)
    : worker_(worker), model_(model) {
  const detail::SetPosition position =
      detail::set_position(engine_of(where, "kolo::ps::WorkerOptimizer"), where.process_set,
                           "kolo::ps::WorkerOptimizer");
  rank_ = position.rank;
  world_size_ = position.size;
  worker_.pull();  // the first step's parameters
}

torch::Tensor WorkerOptimizer::step() {
  worker_.push();
  worker_.pull();
  return {};
}

void WorkerOptimizer::zero_grad() { model_.zero_grad(); }

torch::optim::Optimizer& WorkerOptimizer::optimizer() {
  throw ContractError(
      "kolo::ps::WorkerOptimizer: the optimizer lives on the parameter servers, which apply "
      "it to the pushed gradients; a worker has none to change (set its rate where the "
      "servers build it, and leave out callbacks such as LearningRateWarmup)");
}

void WorkerOptimizer::save(const std::string& dir, const CheckpointState&) {
  throw ContractError("kolo::ps::WorkerOptimizer: cannot save '" + dir +
                      "': a worker holds no optimizer state; the parameter servers hold the "
                      "parameters and the optimizer's state (docs/strategies.md)");
}

CheckpointState WorkerOptimizer::load(const std::string& dir) {
  throw ContractError("kolo::ps::WorkerOptimizer: cannot load '" + dir +
                      "': a worker takes its parameters from the parameter servers "
                      "(docs/strategies.md)");
}

}  // namespace kolo::ps
