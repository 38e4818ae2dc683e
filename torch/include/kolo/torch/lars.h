// kolo::LARS: layer-wise adaptive rate scaling for SGD with momentum (You,
// Gitman, Ginsburg, "Large Batch Training of Convolutional Networks", 2017,
// Algorithm 1), as a torch::optim::Optimizer. See layerwise.h for what it
// shares with LAMB (groups, exclusions, state, sharding) and
// docs/large_batch.md for the recipe.
//
//   kolo::LARS lars(kolo::layerwise_param_groups(
//       model->named_parameters(), kolo::LARSOptions(2.0).momentum(0.9).weight_decay(5e-4)));
//
// Per parameter tensor w with gradient g, in a group with learning rate lr
// (the paper's global rate gamma_t), momentum m, weight decay beta and trust
// coefficient eta:
//
//   lambda = eta * ||w|| / (||g|| + beta * ||w|| + eps)    (1 if ||w|| or ||g|| is 0)
//   rate   = lr * lambda                                 (adapt, the default)
//          = min(lr, lambda)   with trust_clip            (NVIDIA's LARC "clip" mode)
//          = lr                with adapt false           (plain SGD with momentum)
//   v      = m * v + rate * (g + beta * w)                (v = rate * (g + beta * w) at step 1)
//   w      = w - v                (nesterov: w - (rate * (g + beta * w) + m * v))
//
// The rate is inside the momentum, as in the paper (so a warmup or decay of
// lr acts on new gradients, not on the velocity already built up). Norms are
// over the whole tensor, also under ZeRO (layerwise.h). With m = 0 there is
// no momentum state.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <vector>

#include "kolo/torch/layerwise.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct LARSOptions : public torch::optim::OptimizerCloneableOptions<LARSOptions> {
  LARSOptions(double lr = 0.1);  // NOLINT: libtorch's optimizers take lr implicitly too
  TORCH_ARG(double, lr) = 0.1;
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(double, trust_coefficient) = 0.001;  // eta
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(bool, trust_clip) = false;
  TORCH_ARG(bool, adapt) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double value) override { lr(value); }
  friend bool operator==(const LARSOptions& lhs, const LARSOptions& rhs);
};

struct LARSParamState : public torch::optim::OptimizerCloneableParamState<LARSParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);  // v, shaped like the parameter

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LARSParamState& lhs, const LARSParamState& rhs);
};

class LARS : public LayerwiseOptimizer {
 public:
  // ContractError naming the group and option for a negative lr, momentum,
  // weight decay, trust coefficient or eps, momentum >= 1, nesterov without
  // momentum, or a group whose options are not LARSOptions.
  explicit LARS(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LARSOptions defaults = {});
  explicit LARS(std::vector<torch::Tensor> params, LARSOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  bool group_adapts(size_t group) const override;
};

}  // namespace kolo
#pragma GCC visibility pop
