// TorchState (kolo/torch/elastic.h).
#include "kolo/torch/elastic.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kolo/core/errors.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/mixed_precision.h"
#include "kolo/torch/trainer.h"

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

// --- TrainerState ----------------------------------------------------------

namespace {

// The trainer's own entries in a commit's extras (the callbacks' are
// "callback<i>/...", the loss scaler's its own).
constexpr const char* kTotalsKey = "trainer/epoch_totals";
constexpr const char* kWorldKey = "trainer/world_size";

bool is_state_key(const std::string& key) {
  return key.rfind("trainer/", 0) == 0 || key.rfind("elastic/", 0) == 0;
}

}  // namespace

TrainerState::TrainerState(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           size_t dataset_size, Options options)
    : TorchState(model, &optimizer, dataset_size, options.sampling, options),
      options_(std::move(options)),
      optimizer_(optimizer) {
  keep([this] { return save_extras(); }, [this](const Extras& extras) { restore_extras(extras); });
}

TrainerState::~TrainerState() = default;

TorchState::Extras TrainerState::save_extras() {
  if (trainer_ != nullptr) {
    // The round's trainer: its loss scale and every callback's state now.
    Extras fresh;
    if (const LossScaler* scaler = trainer_->options().loss_scaler) fresh = scaler->extras();
    for (size_t i = 0; i < trainer_->callbacks_.size(); ++i) {
      for (auto& [key, value] : trainer_->callbacks_[i]->save_state()) {
        fresh[Trainer::callback_prefix(i) + key] = std::move(value);
      }
    }
    extras_ = std::move(fresh);
  }
  Extras out = extras_;
  // Hexadecimal floats: the totals come back bit for bit.
  char totals[160];
  std::snprintf(totals, sizeof(totals), "%a %a %a %a", totals_.loss_sum, totals_.correct,
                totals_.samples, totals_.started);
  out[kTotalsKey] = totals;
  out[kWorldKey] = std::to_string(committed_world_);
  return out;
}

void TrainerState::restore_extras(const Extras& extras) {
  const auto totals = extras.find(kTotalsKey);
  const auto world = extras.find(kWorldKey);
  if (totals == extras.end() || world == extras.end()) {
    throw ContractError(
        "kolo::elastic::TrainerState: the commit has no '" + std::string(kTotalsKey) + "' or '" +
        kWorldKey + "'; it was not written by a TrainerState (a TorchState's commit does not fit)");
  }
  EpochTotals parsed;
  if (std::sscanf(totals->second.c_str(), "%la %la %la %la", &parsed.loss_sum, &parsed.correct,
                  &parsed.samples, &parsed.started) != 4) {
    throw ContractError("kolo::elastic::TrainerState: the commit's '" + std::string(kTotalsKey) +
                        "' is not four numbers");
  }
  char* end = nullptr;
  const long size = std::strtol(world->second.c_str(), &end, 10);
  if (world->second.empty() || *end != '\0' || size < 0) {
    throw ContractError("kolo::elastic::TrainerState: the commit's '" + std::string(kWorldKey) +
                        "' is not a world size");
  }
  totals_ = parsed;
  committed_world_ = static_cast<int>(size);
  extras_.clear();
  for (const auto& [key, value] : extras) {
    if (!is_state_key(key)) extras_[key] = value;
  }
  restored_ = true;
}

}  // namespace kolo::elastic
