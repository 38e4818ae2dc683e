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

}  // namespace kolo::elastic
#pragma GCC visibility pop
