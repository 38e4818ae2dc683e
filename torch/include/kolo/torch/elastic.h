// Elastic training with libtorch: a kolo::elastic::State holding a model, its
// optimizer and the position in the data (docs/elastic.md). Use it with
// kolo::elastic::run (kolo/core/elastic.h):
//
//   kolo::DistributedSamplerOptions sampling;  // shuffle, seed, drop_last
//   kolo::elastic::TorchState state(*model, &adam, dataset_size, sampling);
//   kolo::elastic::run(state, [&] {
//     for (; state.epoch < epochs; ++state.epoch, state.batch = 0) {
//       kolo::DistributedSampler& sampler = state.sampler();  // this world's shard
//       while (auto indices = sampler.next(batch_size)) {
//         ... step on *indices ...
//         ++state.batch;
//         if (state.batch % commit_every == 0) state.commit();
//       }
//     }
//   });
//
// What a commit holds: the model's parameters and buffers, the optimizer's
// state and parameter-group options (kolo's checkpoint encoding, without RNG
// states), the epoch, the batch count, and how many samples of the epoch's
// order the whole world has taken. After a membership change the sampler
// shards only the samples not yet taken, for the new world: across the old
// and the new world every sample of the epoch is taken once, except the
// steps done after the last commit, which are done again (docs/elastic.md,
// "Commit granularity").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/elastic.h"
#include "kolo/torch/sampler.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {
class Trainer;
}
namespace kolo::elastic {

class TorchState : public State {
 public:
  // `model` and `optimizer` (nullptr = model only) are the caller's and must
  // outlive the state; a commit restores into them in place, so references
  // to their tensors stay valid. `sampler_options.rank/size` are ignored: the
  // sampler always shards for the state's current world (world_rank(),
  // world_size()). `dataset_size` is the number of samples of an epoch.
  TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, size_t dataset_size,
             DistributedSamplerOptions sampler_options = {}, State::Options options = {});
  ~TorchState() override;

  // This world's shard of the current epoch, positioned where the job stands.
  // Built afresh when the world changed or a commit was restored since the
  // last call: its epoch start (DistributedSampler::set_epoch_start) is then
  // the samples of the epoch the whole world had taken. Follows `epoch`
  // (set_epoch when the training loop moved on). Call it again after every
  // run() round (at the top of the epoch loop): a reference kept from an
  // earlier world goes stale.
  DistributedSampler& sampler();

  // Samples of the current epoch's order the whole world has taken (what a
  // commit now would record).
  int64_t consumed_samples() const;
  size_t dataset_size() const { return dataset_size_; }

  // Something else every commit holds, e.g. a LossScaler's scale
  // (mixed_precision.h):
  //   state.keep([&] { return scaler.extras(); },
  //              [&](const auto& extras) { scaler.restore(extras); });
  // At each commit `save`'s entries join the commit's extras (keys must not
  // start with "elastic/"); when a commit is restored, `restore` receives its
  // extras. Call before run(); callbacks run in the order they were added.
  using Extras = std::map<std::string, std::string>;
  void keep(std::function<Extras()> save, std::function<void(const Extras&)> restore);

 protected:
  Bytes serialize() override;
  void deserialize(const Bytes& bytes) override;

 private:
  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  size_t dataset_size_;
  DistributedSamplerOptions sampler_options_;
  std::unique_ptr<DistributedSampler> sampler_;
  // The world sampler_ was built for.
  int built_rank_ = -1;
  int built_size_ = -1;
  // From the last deserialize(), applied when the sampler is next built:
  // the epoch and the samples of it taken (pending_epoch_ < 0 = nothing pending).
  int64_t pending_epoch_ = -1;
  int64_t pending_consumed_ = 0;
  std::vector<std::pair<std::function<Extras()>, std::function<void(const Extras&)>>> kept_;
};

// The state of an elastic kolo::Trainer::fit (Horovod's KerasState with its
// commit and update callbacks built in; docs/elastic.md, "Elastic fit"):
//
//   kolo::elastic::TrainerState::Options elastic;
//   elastic.commit_every = 10;          // batches between commits
//   elastic.sampling.seed = 42;         // the training sampler's options
//   kolo::elastic::TrainerState state(*model, adam, train.size, elastic);
//   auto warmup = std::make_shared<kolo::LearningRateWarmup>(...);  // callbacks outlive rounds
//   kolo::elastic::run(state, [&] {
//     auto optimizer = kolo::make_parallel_optimizer(adam, *model, {});  // this world's
//     kolo::TrainerOptions options;
//     options.elastic = &state;
//     kolo::Trainer trainer(*model, forward, loss, *optimizer, options);
//     trainer.add(warmup);
//     trainer.fit(train, &test);
//   });
//
// fit() then trains from the state's position (epoch, batch, the samples of
// the epoch the world has taken) and commits it every commit_every batches
// and at every epoch's end. A commit holds what TorchState holds, plus the
// epoch's training metrics summed over the world (so that an epoch's logs
// cover all of it, whatever re-formations happened in it), the trainer's loss
// scale (TrainerOptions::loss_scaler), every callback's save_state(), and the
// world size it was made in (for scale_lr). The callbacks are the caller's,
// kept across rounds; each round builds its optimizer and Trainer afresh
// (both belong to that round's engine).
struct TrainerStateOptions : State::Options {
  // Batches between commits (each also asks kolorun whether workers wait
  // to join); the end of every epoch is a commit too. After a fault at most
  // commit_every - 1 batches are trained again.
  int64_t commit_every = 100;
  // When a commit made in a world of n ranks resumes in a world of m, every
  // parameter group's rate becomes group 0's committed rate x m / n (the
  // linear scaling rule; Horovod users do it in a reset callback). A rate
  // set by a callback every batch (LearningRateWarmup) overrides it.
  bool scale_lr = false;
  // The training sampler's shuffle, seed and drop_last (TrainerOptions::
  // sampling must agree: fit() checks); rank and world size are the world's.
  DistributedSamplerOptions sampling;
};
class TrainerState : public TorchState {
 public:
  using Options = TrainerStateOptions;
  // `model` and `optimizer` (what the round's ParallelOptimizer wraps) are
  // the caller's and must outlive the state; `dataset_size`: the training set's.
  TrainerState(torch::nn::Module& model, torch::optim::Optimizer& optimizer, size_t dataset_size,
               Options options = {});
  ~TrainerState() override;

  const Options& trainer_options() const { return options_; }

  // The current epoch's training metrics, summed over the world up to the
  // last commit (the batches since are added at the next one).
  struct EpochTotals {
    double loss_sum = 0;  // sum over the samples of the loss
    double correct = 0;   // correct predictions (class scores only)
    double samples = 0;
    double started = 0;  // when the epoch's first batch ran, system_clock seconds (0: not yet)
  };
  const EpochTotals& totals() const { return totals_; }

 private:
  // fit()'s side (torch/src/trainer.cc): it attaches itself for a round,
  // applies restored extras to its callbacks, and updates the totals.
  friend class kolo::Trainer;
  Extras save_extras();
  void restore_extras(const Extras& extras);

  Options options_;
  torch::optim::Optimizer& optimizer_;
  EpochTotals totals_;
  // The Trainer of the round being trained (nullptr between rounds: a sync
  // at a round's start then sends the extras last committed or restored).
  Trainer* trainer_ = nullptr;
  Extras extras_;          // the callbacks' and the loss scaler's, as last committed or restored
  bool restored_ = false;  // extras_ came from a restore that fit() has not applied yet
  // The world size of the last commit (fit() sets it to its world's); 0 in
  // a state no trainer has begun: a commit or sync of it is not a resume.
  int committed_world_ = 0;
};

}  // namespace kolo::elastic
#pragma GCC visibility pop
