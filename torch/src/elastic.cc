// TorchState (kolo/torch/elastic.h).
#include "kolo/torch/elastic.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "kolo/core/errors.h"
#include "kolo/torch/checkpoint.h"

namespace kolo::elastic {
namespace {

// The checkpoint extra holding the samples of the epoch the world had taken.
constexpr const char* kConsumedKey = "elastic/consumed_samples";

}  // namespace

TorchState::TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                       size_t dataset_size, DistributedSamplerOptions sampler_options,
                       State::Options options)
    : State(std::move(options)),
      model_(model),
      optimizer_(optimizer),
      dataset_size_(dataset_size),
      sampler_options_(sampler_options) {}

TorchState::~TorchState() = default;

int64_t TorchState::consumed_samples() const {
  if (pending_epoch_ >= 0) return pending_epoch_ == epoch ? pending_consumed_ : 0;
  if (!sampler_ || sampler_->epoch() != epoch) return 0;  // the loop moved on to a new epoch
  return sampler_->consumed();
}

DistributedSampler& TorchState::sampler() {
  const int rank = world_rank();
  const int size = world_size();
  if (sampler_ && pending_epoch_ < 0 && rank == built_rank_ && size == built_size_) {
    if (sampler_->epoch() != epoch) sampler_->set_epoch(epoch);
    return *sampler_;
  }
  const int64_t consumed = consumed_samples();
  DistributedSamplerOptions o = sampler_options_;
  o.rank = rank;
  o.world_size = size;
  auto sampler = std::make_unique<DistributedSampler>(dataset_size_, o);
  sampler->set_epoch(epoch);
  sampler->set_epoch_start(consumed);
  sampler_ = std::move(sampler);
  built_rank_ = rank;
  built_size_ = size;
  pending_epoch_ = -1;
  return *sampler_;
}

void TorchState::keep(std::function<Extras()> save, std::function<void(const Extras&)> restore) {
  if (!save || !restore) {
    throw ContractError("kolo::elastic::TorchState::keep: give both a save and a restore callback");
  }
  kept_.emplace_back(std::move(save), std::move(restore));
}

Bytes TorchState::serialize() {
  CheckpointState state;
  state.epoch = epoch;
  state.step = batch;
  state.seed = sampler_options_.seed;
  for (const auto& kept : kept_) {
    for (auto& [key, value] : kept.first()) {
      if (key.rfind("elastic/", 0) == 0) {
        throw ContractError("kolo::elastic::TorchState::keep: the extra '" + key +
                            "' starts with \"elastic/\", which the state's own entries use; "
                            "rename it");
      }
      state.extras[key] = std::move(value);
    }
  }
  state.extras[kConsumedKey] = std::to_string(consumed_samples());
  const std::string payload = encode_checkpoint(model_, optimizer_, state);
  return Bytes(payload.begin(), payload.end());
}

void TorchState::deserialize(const Bytes& bytes) {
  const std::string payload(bytes.begin(), bytes.end());
  const CheckpointState state = decode_checkpoint(payload, model_, optimizer_,
                                                  "an elastic commit (kolo::elastic::TorchState)");
  const auto it = state.extras.find(kConsumedKey);
  if (it == state.extras.end()) {
    throw ContractError(
        "kolo::elastic::TorchState: the commit has no '" + std::string(kConsumedKey) +
        "'; it was not written by a TorchState (load_commit bytes from TorchState::committed())");
  }
  char* end = nullptr;
  errno = 0;
  const long long consumed = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno != 0) {
    throw ContractError("kolo::elastic::TorchState: the commit's '" + std::string(kConsumedKey) +
                        "' is not a number");
  }
  if (consumed < 0 || static_cast<size_t>(consumed) > dataset_size_) {
    throw ContractError("kolo::elastic::TorchState: the commit took " + std::to_string(consumed) +
                        " samples of an epoch, this state's dataset has " +
                        std::to_string(dataset_size_) +
                        "; build the state with the dataset size of the committing run");
  }
  for (const auto& kept : kept_) kept.second(state.extras);
  pending_epoch_ = state.epoch;
  pending_consumed_ = consumed;
  sampler_.reset();  // rebuilt by the next sampler() for this world and position
}

}  // namespace kolo::elastic
