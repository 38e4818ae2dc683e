// kolo::ps::WorkerOptimizer: a parameter-server worker (kolo::ps::Worker,
// parameter_server.h) behind the ParallelOptimizer interface, so that
// kolo::Trainer and its callbacks train a model on the parameter server as
// they train it with DistributedOptimizer:
//
//   // mode sync: the workers' collectives among them (every rank adds the set)
//   kolo::ProcessSet workers = engine.add_process_set({0, ..., W - 1});
//   kolo::CallOptions where{.process_set = workers.id()};
//   // modes async and ssp: each worker's own (kolo::make_solo_engine)
//   std::unique_ptr<kolo::Engine> own = kolo::make_solo_engine();
//   kolo::CallOptions where{.engine = own.get()};
//
//   kolo::ps::Worker worker(model->named_parameters(), std::move(links), ps_options);
//   kolo::ps::WorkerOptimizer optimizer(worker, *model, where);
//   // trainer_options: a TrainerOptions whose CallOptions are `where`
//   kolo::Trainer trainer(*model, forward, loss, optimizer, trainer_options);
//
// The constructor pulls the servers' parameters into the model (the first
// step's). step() pushes the gradients of the step and pulls the parameters
// of the next one (in sync mode: after every worker's push was applied), so
// the model always holds what the next forward pass needs, and after the
// last step it holds the parameters an evaluation should see.
//
// The optimizer itself lives on the servers: optimizer() is a ContractError
// (callbacks that change its rate, LearningRateWarmup, cannot run; the rate
// is the servers' optimizer's). rank() and world_size() are this worker's
// index and the number of workers (Roles), over which the data is sharded.
// `where` runs the Trainer's collectives (metric averages): in sync mode the
// workers' process set (the servers run no collectives), where every step
// waits for every worker anyway; in async and ssp modes an engine of the
// worker's own, so that no worker ever waits for another (one evicted as
// frozen, or restarted: a restarted worker has no world to share) and each
// reports its own metrics.
//
// Checkpoints (save_checkpoint / load_checkpoint of parallel_optimizer.h,
// and so kolo::ModelCheckpoint): the servers' shards are the checkpoint
// (PsOptions::checkpoint_dir, checkpoint_every, resume_from); a worker
// writes nothing, it checks that the servers save what the call asks for.
// The contract, on the servers and the workers alike: checkpoint_dir = the
// checkpoint's directory and checkpoint_every = the steps of one epoch, so
// that the servers save exactly at each epoch's end (in sync mode the save
// has happened when step() returns; in async and ssp modes it happens once
// the slowest worker gets there, and holds whatever the faster ones pushed
// by then); resume_from = the directory to continue from it.
//  - save(dir, {epoch E, ...}): ContractError unless dir is checkpoint_dir
//    and E epochs end at the step the servers save (this worker's step =
//    E x checkpoint_every, on all its workers).
//  - load(dir): the servers resumed from dir at step S (the step they greet
//    the workers with); returns epoch S / checkpoint_every (step S, sampler
//    at that epoch's start). ContractError when the servers did not resume
//    (S = 0) or resume_from is not dir. The rest of CheckpointState (seed,
//    extras, generator states) is not kept.
#pragma once

#include <torch/types.h>

#include <string>

#include "kolo/core/engine.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/parameter_server.h"

namespace torch::nn {
class Module;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo::ps {

class WorkerOptimizer : public ParallelOptimizer {
 public:
  // `worker` and `model` (whose parameters `worker` was built over) must
  // outlive this, and so must `where`'s engine.
  WorkerOptimizer(Worker& worker, torch::nn::Module& model, const CallOptions& where);

  // push() this step's gradients, then pull() the next step's parameters.
  torch::Tensor step() override;
  // Nothing to exchange before step(): the gradients are this worker's own
  // (the servers average or apply them as the mode says).
  void synchronize() override {}
  void zero_grad() override;
  torch::optim::Optimizer& optimizer() override;  // ContractError: it lives on the servers
  int zero_stage() const override { return 0; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Worker& worker() { return worker_; }

 private:
  void save(const std::string& dir, const CheckpointState& state) override;
  CheckpointState load(const std::string& dir) override;

  // ContractError unless checkpoint_dir (or resume_from) is `dir` and
  // checkpoint_every > 0; `op` names the call.
  void check_checkpoint_options(const std::string& op, const std::string& dir,
                                std::string PsOptions::*field) const;

  Worker& worker_;
  torch::nn::Module& model_;
  int64_t start_step_ = 0;  // the step the servers continue from (a resumed save's)
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace kolo::ps
#pragma GCC visibility pop
