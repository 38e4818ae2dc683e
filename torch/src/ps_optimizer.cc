// kolo::ps::WorkerOptimizer (ps_optimizer.h): a ps::Worker as a ParallelOptimizer.
#include "kolo/torch/ps_optimizer.h"

#include <torch/nn/module.h>

#include "common.h"
#include "kolo/core/errors.h"
#include "kolo/torch/tensor.h"

namespace kolo::ps {

WorkerOptimizer::WorkerOptimizer(Worker& worker, torch::nn::Module& model, const CallOptions& where)
    : worker_(worker), model_(model) {
  // The data is sharded over the workers whatever `where` is (a process set
  // of them, or an engine of this worker's own).
  detail::set_position(engine_of(where, "kolo::ps::WorkerOptimizer"), where.process_set,
                       "kolo::ps::WorkerOptimizer");
  rank_ = worker_.roles().worker_index();
  world_size_ = worker_.roles().workers;
  start_step_ = worker_.clock();
  worker_.pull();  // the first step's parameters
}

torch::Tensor WorkerOptimizer::step() {
  worker_.push();
  worker_.pull();
  return {};
}

void WorkerOptimizer::zero_grad() { model_.zero_grad(/*set_to_none=*/false); }

torch::optim::Optimizer& WorkerOptimizer::optimizer() {
  throw ContractError(
      "kolo::ps::WorkerOptimizer: the optimizer lives on the parameter servers, which apply "
      "it to the pushed gradients; a worker has none to change (set its rate where the "
      "servers build it, and leave out callbacks such as LearningRateWarmup)");
}

void WorkerOptimizer::check_checkpoint_options(const std::string& op, const std::string& dir,
                                               std::string PsOptions::*field) const {
  const PsOptions& options = worker_.options();
  const char* name = field == &PsOptions::checkpoint_dir ? "checkpoint_dir" : "resume_from";
  if (options.*field != dir || options.checkpoint_every <= 0) {
    throw ContractError(
        "kolo::ps::WorkerOptimizer: " + op + "('" + dir + "'): the parameter servers save the " +
        "parameters and the optimizer's state themselves, a worker holds neither; give the " +
        "servers and the workers PsOptions::" + name + " = '" + dir +
        "' and checkpoint_every = the steps of one epoch (this worker's PsOptions have " + name +
        " '" + options.*field + "', checkpoint_every " + std::to_string(options.checkpoint_every) +
        "; docs/strategies.md)");
  }
}

void WorkerOptimizer::save(const std::string& dir, const CheckpointState& state) {
  check_checkpoint_options("save_checkpoint", dir, &PsOptions::checkpoint_dir);
  const int64_t every = worker_.options().checkpoint_every;
  // The servers save when every worker has pushed a multiple of `every`
  // steps; the epochs saved must end there.
  if (worker_.clock() != state.epoch * every) {
    throw ContractError(
        "kolo::ps::WorkerOptimizer: save_checkpoint('" + dir + "') after epoch " +
        std::to_string(state.epoch) + " at step " + std::to_string(worker_.clock()) +
        ", and the servers save every " + std::to_string(every) + " steps (step " +
        std::to_string(state.epoch * every) + " for this epoch): set PsOptions::checkpoint_every " +
        "to the steps of one epoch on the servers and the workers");
  }
}

CheckpointState WorkerOptimizer::load(const std::string& dir) {
  check_checkpoint_options("load_checkpoint", dir, &PsOptions::resume_from);
  const int64_t every = worker_.options().checkpoint_every;
  if (start_step_ == 0) {
    throw ContractError("kolo::ps::WorkerOptimizer: load_checkpoint('" + dir +
                        "'): the parameter servers start at step 0, not from a save; give the "
                        "servers PsOptions::resume_from = '" +
                        dir + "' too");
  }
  if (start_step_ % every != 0) {
    throw ContractError("kolo::ps::WorkerOptimizer: load_checkpoint('" + dir +
                        "'): the servers resumed at step " + std::to_string(start_step_) +
                        ", not at an epoch's end (checkpoint_every " + std::to_string(every) +
                        "): resume with the checkpoint_every that saved it");
  }
  CheckpointState state;
  state.step = start_step_;
  state.epoch = start_step_ / every;
  state.sampler = {state.epoch, 0};
  return state;
}

}  // namespace kolo::ps
