// The example's choice of optimizer (--optimizer) and its learning-rate
// schedule (--lr, --scale-lr, --warmup-epochs, --lr-decay):
//
//   adam  torch::optim::Adam, lr 1e-3: the seed's optimizer.
//   sgd   torch::optim::SGD with momentum 0.9 and weight decay 5e-4.
//   lars  kolo::LARS (SGD with momentum and layer-wise trust ratios), momentum
//         0.9, weight decay 5e-4, trust coefficient 0.001 (--trust-coefficient;
//         --trust-clip for LARC's min(lr, ratio) instead of lr x ratio).
//   lamb  kolo::LAMB (Adam's update with layer-wise trust ratios), weight
//         decay 0.01, the trust ratio clamped to [0.01, 10] (--min-trust-ratio,
//         --max-trust-ratio).
// lars and lamb take the large-batch recipe's parameter groups: biases and
// the other 1-D parameters without weight decay or adaptation
// (kolo::layerwise_param_groups). Their default rates are the ones measured
// for the 8 x 2048 recipe in docs/large_batch.md.
//
// The schedule, per step:
//   - warmup over --warmup-epochs: with --scale-lr from --lr to --lr x workers
//     (Goyal et al.: the single-worker rate grows to the linearly scaled
//     one); without it from --lr / (warmup steps) to --lr (the LARS and LAMB
//     papers' warmup from near zero, for a rate set for the global batch);
//   - then constant, or (--lr-decay cosine) down to --min-lr (default 0) at
//     the last epoch along half a cosine.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kolo/torch.h"

namespace fashion_mnist {

struct OptimizerChoice {
  std::string name = "adam";  // adam, sgd, lars, lamb
  double lr = 0;              // 0 = the optimizer's default below
  double momentum = 0.9;      // sgd, lars
  double weight_decay = -1;   // < 0 = the optimizer's default below
  // lars: eta, and LARC's clip mode (kolo::LARSOptions).
  double trust_coefficient = 0.001;
  bool trust_clip = false;
  // lamb: the clamp of the trust ratio ||w|| / ||u|| (kolo::LAMBOptions).
  double min_trust_ratio = 0.01;
  double max_trust_ratio = 10;
};

inline double default_lr(const std::string& name) {
  if (name == "sgd") return 0.05;
  if (name == "lars") return 4.0;
  if (name == "lamb") return 0.02;
  return 1e-3;
}

inline double default_weight_decay(const std::string& name) {
  if (name == "sgd" || name == "lars") return 5e-4;
  if (name == "lamb") return 0.01;
  return 0;
}

// The choice with every default filled in.
inline OptimizerChoice resolved(OptimizerChoice choice) {
  if (choice.lr <= 0) choice.lr = default_lr(choice.name);
  if (choice.weight_decay < 0) choice.weight_decay = default_weight_decay(choice.name);
  return choice;
}

// The element-wise optimizers (adam, sgd) over `params` (choice resolved), at
// rate choice.lr; nullptr for the layer-wise ones (lars, lamb), which need
// the model's layers. A parameter server runs it over its slices.
inline std::unique_ptr<torch::optim::Optimizer> make_elementwise_optimizer(
    const OptimizerChoice& choice, std::vector<torch::Tensor> params) {
  if (choice.name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        std::move(params), torch::optim::AdamOptions(choice.lr).weight_decay(choice.weight_decay));
  }
  if (choice.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(choice.lr)
                                                   .momentum(choice.momentum)
                                                   .weight_decay(choice.weight_decay));
  }
  return nullptr;
}

// The optimizer over `model`'s parameters (choice resolved), at rate choice.lr
// (the schedule sets the rate of every step).
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerChoice& choice,
                                                               torch::nn::Module& model) {
  if (auto optimizer = make_elementwise_optimizer(choice, model.parameters())) return optimizer;
  if (choice.name == "lars") {
    return std::make_unique<kolo::LARS>(kolo::layerwise_param_groups(
        model.named_parameters(), kolo::LARSOptions(choice.lr)
                                      .momentum(choice.momentum)
                                      .weight_decay(choice.weight_decay)
                                      .trust_coefficient(choice.trust_coefficient)
                                      .trust_clip(choice.trust_clip)));
  }
  if (choice.name == "lamb") {
    return std::make_unique<kolo::LAMB>(kolo::layerwise_param_groups(
        model.named_parameters(), kolo::LAMBOptions(choice.lr)
                                      .weight_decay(choice.weight_decay)
                                      .min_trust_ratio(choice.min_trust_ratio)
                                      .max_trust_ratio(choice.max_trust_ratio)));
  }
  throw std::invalid_argument("--optimizer is '" + choice.name + "'; use adam, sgd, lars or lamb");
}

struct ScheduleChoice {
  bool scale_lr = false;
  double warmup_epochs = 0;
  std::string decay = "constant";  // constant, cosine
  int epochs = 1;                  // the run's length (cosine reaches min_lr at its end)
  double min_lr = 0;               // cosine: the rate at the last epoch
};

inline kolo::LrScheduleOptions schedule_options(double lr, const ScheduleChoice& choice,
                                                int workers, int64_t steps_per_epoch) {
  kolo::LrScheduleOptions o;
  o.peak_lr = choice.scale_lr ? kolo::scaled_lr(lr, workers) : lr;
  const double warmup_steps = choice.warmup_epochs * static_cast<double>(steps_per_epoch);
  o.base_lr = choice.scale_lr || warmup_steps < 1 ? lr : lr / warmup_steps;
  o.warmup_epochs = choice.warmup_epochs;
  o.steps_per_epoch = steps_per_epoch;
  if (choice.decay == "cosine") {
    o.decay = kolo::LrDecay::kCosine;
    o.total_epochs = choice.epochs;
    o.min_lr = choice.min_lr;
  }
  return o;
}

}  // namespace fashion_mnist
