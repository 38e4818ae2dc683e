// kolo::LAMB (kolo/torch/lamb.h).
#include "kolo/torch/lamb.h"

#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"

namespace kolo {

namespace {

constexpr const char* kOp = "kolo::LAMB";

void check(const LAMBOptions& o, size_t group) {
  std::ostringstream error;
  const std::string where = "parameter group " + std::to_string(group) + ": ";
  const double b1 = std::get<0>(o.betas());
  const double b2 = std::get<1>(o.betas());
  if (o.lr() < 0) {
    error << where << "lr is " << o.lr() << "; it must be >= 0";
  } else if (b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
    error << where << "betas are (" << b1 << ", " << b2 << "); each must be in [0, 1)";
  } else if (o.eps() < 0) {
    error << where << "eps is " << o.eps() << "; it must be >= 0";
  } else if (o.weight_decay() < 0) {
    error << where << "weight_decay is " << o.weight_decay() << "; it must be >= 0";
  } else if (o.min_trust_ratio() < 0 || o.min_trust_ratio() > o.max_trust_ratio()) {
    error << where << "the trust ratio bounds are [" << o.min_trust_ratio() << ", "
          << o.max_trust_ratio()
          << "]; use 0 <= min_trust_ratio <= max_trust_ratio (0 and infinity: no clamp)";
  }
  if (!error.str().empty()) throw ContractError(std::string(kOp) + ": " + error.str());
}

}  // namespace

LAMBOptions::LAMBOptions(double lr) : lr_(lr) {}

bool operator==(const LAMBOptions& lhs, const LAMBOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() &&
         lhs.bias_correction() == rhs.bias_correction() &&
         lhs.min_trust_ratio() == rhs.min_trust_ratio() &&
         lhs.max_trust_ratio() == rhs.max_trust_ratio() && lhs.adapt() == rhs.adapt();
}

void LAMBOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_trust_ratio);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_trust_ratio);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adapt);
}

void LAMBOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, min_trust_ratio);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_trust_ratio);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adapt);
}

bool operator==(const LAMBParamState& lhs, const LAMBParamState& rhs) {
  return lhs.step() == rhs.step() && torch::equal(lhs.exp_avg(), rhs.exp_avg()) &&
         torch::equal(lhs.exp_avg_sq(), rhs.exp_avg_sq());
}

void LAMBParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LAMBParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

LAMB::LAMB(std::vector<torch::optim::OptimizerParamGroup> param_groups, LAMBOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), std::make_unique<LAMBOptions>(defaults)) {
  check_group_options<LAMBOptions>(kOp);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check(static_cast<const LAMBOptions&>(param_groups_[g].options()), g);
  }
}

LAMB::LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults)
    : LAMB({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

bool LAMB::group_adapts(size_t group) const {
  return static_cast<const LAMBOptions&>(param_groups_[group].options()).adapt();
}

torch::Tensor LAMB::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_group_options<LAMBOptions>(kOp);
  const std::vector<Slot> slots = this->slots();
  // First the new moments and each parameter's Adam-style update u; the
  // trust ratio then needs ||w|| and ||u|| over each whole layer. The state
  // changes only once the norms are known: a failed reduction (a peer gone,
  // under ZeRO) leaves the optimizer as it was.
  std::vector<torch::Tensor> weights;
  std::vector<torch::Tensor> updates;
  std::vector<torch::Tensor> new_m;
  std::vector<torch::Tensor> new_v;
  for (const Slot& slot : slots) {
    const auto& o = static_cast<const LAMBOptions&>(param_groups_[slot.group].options());
    const torch::Tensor& w = slot.param;
    const torch::Tensor& g = w.grad();
    auto it = state_.find(compat::optimizer_state_key(w));
    const auto* state =
        it == state_.end() ? nullptr : static_cast<const LAMBParamState*>(it->second.get());
    const int64_t step = (state ? state->step() : 0) + 1;
    const double b1 = std::get<0>(o.betas());
    const double b2 = std::get<1>(o.betas());
    // m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g^2, from m = v = 0 at step 1.
    torch::Tensor m = state ? state->exp_avg() * b1 : torch::zeros_like(w);
    m.add_(g, 1 - b1);
    torch::Tensor v = state ? state->exp_avg_sq() * b2 : torch::zeros_like(w);
    v.addcmul_(g, g, 1 - b2);
    double c1 = 1;
    double c2 = 1;
    if (o.bias_correction()) {
      c1 = 1 - std::pow(b1, static_cast<double>(step));
      c2 = 1 - std::pow(b2, static_cast<double>(step));
    }
    torch::Tensor u = (v / c2).sqrt_().add_(o.eps());
    u = (m / c1).div_(u);
    if (o.weight_decay() != 0) u.add_(w, o.weight_decay());
    weights.push_back(w);
    updates.push_back(std::move(u));
    new_m.push_back(std::move(m));
    new_v.push_back(std::move(v));
  }
  const auto norms = layer_norms(slots, weights, updates);

  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    const auto& o = static_cast<const LAMBOptions&>(param_groups_[slot.group].options());
    const torch::Tensor& w = slot.param;
    auto& state = state_[compat::optimizer_state_key(w)];
    if (!state) state = std::make_unique<LAMBParamState>();
    auto& lamb_state = static_cast<LAMBParamState&>(*state);
    lamb_state.step(lamb_state.step() + 1);
    lamb_state.exp_avg(new_m[i]);
    lamb_state.exp_avg_sq(new_v[i]);
    const int64_t n = w.numel();
    const std::vector<LayerRun> runs = runs_of(slot);
    for (size_t r = 0; r < runs.size(); ++r) {
      double ratio = 1.0;
      if (o.adapt()) {
        const double w_norm = norms[i][r][0];
        const double u_norm = norms[i][r][1];
        if (w_norm > 0 && u_norm > 0) {
          ratio = std::clamp(w_norm / u_norm, o.min_trust_ratio(), o.max_trust_ratio());
        }
      }
      elements(w, runs[r], n).sub_(elements(updates[i], runs[r], n), o.lr() * ratio);
    }
  }
  return loss;
}

void LAMB::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LAMBParamState, LAMBOptions>(archive, *this);
}

void LAMB::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LAMBParamState, LAMBOptions>(archive, *this);
}

}  // namespace kolo
