// kolo::LAMB: layer-wise adaptive moments (You et al., "Large Batch
// Optimization for Deep Learning: Training BERT in 76 minutes", 2019,
// Algorithm 2), with bias correction and decoupled weight decay as NVIDIA's
// FusedLAMB and DeepSpeed's FusedLamb implement it, as a
// torch::optim::Optimizer. See layerwise.h for what it shares with LARS
// (groups, exclusions, state, sharding) and docs/large_batch.md for the recipe.
//
//   kolo::LAMB lamb(kolo::layerwise_param_groups(
//       model->named_parameters(), kolo::LAMBOptions(1e-2).weight_decay(0.01)));
//
// Per parameter tensor w with gradient g at its step t (counted per
// parameter, from 1), in a group with learning rate lr, betas (b1, b2),
// weight decay lambda:
//
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g^2
//   u = (m / c1) / (sqrt(v / c2) + eps) + lambda * w     c1 = 1 - b1^t, c2 = 1 - b2^t
//                                                        (1 and 1 without bias_correction)
//   r = clamp(||w|| / ||u||, min_trust_ratio, max_trust_ratio)   (1 if ||w|| or ||u|| is 0)
//     = 1                                           with adapt false (AdamW's update)
//   w = w - lr * r * u
//
// The trust-ratio clamp is the paper's phi (which it leaves open) as
// DeepSpeed bounds it: [0.01, 10] by default; [0, inf) turns it off (NVIDIA's
// FusedLAMB). Norms are over the whole tensor, also under ZeRO
// (layerwise.h). Gradient clipping by the global norm (FusedLAMB's
// max_grad_norm) is not part of the step: clip between
// DistributedOptimizer::synchronize() and step() if wanted.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <tuple>
#include <vector>

#include "kolo/torch/layerwise.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  LAMBOptions(double lr = 1e-3);  // NOLINT: libtorch's optimizers take lr implicitly too
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, bias_correction) = true;
  TORCH_ARG(double, min_trust_ratio) = 0.01;
  TORCH_ARG(double, max_trust_ratio) = 10.0;
  TORCH_ARG(bool, adapt) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double value) override { lr(value); }
  friend bool operator==(const LAMBOptions& lhs, const LAMBOptions& rhs);
};

struct LAMBParamState : public torch::optim::OptimizerCloneableParamState<LAMBParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     // m, shaped like the parameter
  TORCH_ARG(torch::Tensor, exp_avg_sq);  // v, shaped like the parameter

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LAMBParamState& lhs, const LAMBParamState& rhs);
};

class LAMB : public LayerwiseOptimizer {
 public:
  // ContractError naming the group and option for a negative lr, eps or
  // weight decay, a beta outside [0, 1), min_trust_ratio < 0 or above
  // max_trust_ratio, or a group whose options are not LAMBOptions.
  explicit LAMB(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LAMBOptions defaults = {});
  explicit LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  bool group_adapts(size_t group) const override;
};

}  // namespace kolo
#pragma GCC visibility pop
