// kolo::LARS (kolo/torch/lars.h).
#include "kolo/torch/lars.h"

#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <sstream>

#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"

namespace kolo {

namespace {

constexpr const char* kOp = "kolo::LARS";

void check(const LARSOptions& o, size_t group) {
  std::ostringstream error;
  const std::string where = "parameter group " + std::to_string(group) + ": ";
  if (o.lr() < 0) {
    error << where << "lr is " << o.lr() << "; it must be >= 0";
  } else if (o.momentum() < 0 || o.momentum() >= 1) {
    error << where << "momentum is " << o.momentum() << "; it must be in [0, 1)";
  } else if (o.nesterov() && o.momentum() == 0) {
    error << where << "nesterov needs momentum > 0";
  } else if (o.weight_decay() < 0) {
    error << where << "weight_decay is " << o.weight_decay() << "; it must be >= 0";
  } else if (o.trust_coefficient() <= 0) {
    error << where << "trust_coefficient is " << o.trust_coefficient()
          << "; it must be > 0 (the paper's eta, typically 0.001)";
  } else if (o.eps() < 0) {
    error << where << "eps is " << o.eps() << "; it must be >= 0";
  }
  if (!error.str().empty()) throw ContractError(std::string(kOp) + ": " + error.str());
}

}  // namespace

LARSOptions::LARSOptions(double lr) : lr_(lr) {}

bool operator==(const LARSOptions& lhs, const LARSOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.momentum() == rhs.momentum() &&
         lhs.nesterov() == rhs.nesterov() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.trust_coefficient() == rhs.trust_coefficient() && lhs.eps() == rhs.eps() &&
         lhs.trust_clip() == rhs.trust_clip() && lhs.adapt() == rhs.adapt();
}

void LARSOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_coefficient);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_clip);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adapt);
}

void LARSOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, trust_coefficient);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, trust_clip);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adapt);
}

bool operator==(const LARSParamState& lhs, const LARSParamState& rhs) {
  return torch::equal_if_defined(lhs.momentum_buffer(), rhs.momentum_buffer());
}

void LARSParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void LARSParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

LARS::LARS(std::vector<torch::optim::OptimizerParamGroup> param_groups, LARSOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), std::make_unique<LARSOptions>(defaults)) {
  check_group_options<LARSOptions>(kOp);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check(static_cast<const LARSOptions&>(param_groups_[g].options()), g);
  }
}

LARS::LARS(std::vector<torch::Tensor> params, LARSOptions defaults)
    : LARS({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

bool LARS::group_adapts(size_t group) const {
  return static_cast<const LARSOptions&>(param_groups_[group].options()).adapt();
}

torch::Tensor LARS::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_group_options<LARSOptions>(kOp);
  const std::vector<Slot> slots = this->slots();
  // The trust ratio needs ||w|| and ||g|| over each whole layer.
  std::vector<torch::Tensor> weights;
  std::vector<torch::Tensor> grads;
  for (const Slot& slot : slots) {
    weights.push_back(slot.param);
    grads.push_back(slot.param.grad());
  }
  const auto norms = layer_norms(slots, weights, grads);

  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    const auto& o = static_cast<const LARSOptions&>(param_groups_[slot.group].options());
    const torch::Tensor& w = slot.param;
    const int64_t n = w.numel();
    // d = g + beta * w, scaled per layer below.
    torch::Tensor d = w.grad();
    if (o.weight_decay() != 0) d = d.add(w, o.weight_decay());
    torch::Tensor scaled = torch::empty_like(d);
    const std::vector<LayerRun> runs = runs_of(slot);
    for (size_t r = 0; r < runs.size(); ++r) {
      double rate = o.lr();
      if (o.adapt()) {
        const double w_norm = norms[i][r][0];
        const double g_norm = norms[i][r][1];
        double lambda = 1.0;
        if (w_norm > 0 && g_norm > 0) {
          lambda = o.trust_coefficient() * w_norm / (g_norm + o.weight_decay() * w_norm + o.eps());
        }
        rate = o.trust_clip() ? std::min(o.lr(), lambda) : o.lr() * lambda;
      }
      elements(scaled, runs[r], n).copy_(elements(d, runs[r], n)).mul_(rate);
    }
    if (o.momentum() == 0) {
      w.sub_(scaled);
      continue;
    }
    const auto key = compat::optimizer_state_key(w);
    auto it = state_.find(key);
    if (it == state_.end()) {
      auto state = std::make_unique<LARSParamState>();
      state->momentum_buffer(scaled.clone(at::MemoryFormat::Preserve));
      it = state_.emplace(key, std::move(state)).first;
    } else {
      static_cast<LARSParamState&>(*it->second).momentum_buffer().mul_(o.momentum()).add_(scaled);
    }
    const torch::Tensor& v = static_cast<LARSParamState&>(*it->second).momentum_buffer();
    if (o.nesterov()) {
      w.sub_(scaled.add(v, o.momentum()));
    } else {
      w.sub_(v);
    }
  }
  return loss;
}

void LARS::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LARSParamState, LARSOptions>(archive, *this);
}

void LARS::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LARSParamState, LARSOptions>(archive, *this);
}

}  // namespace kolo
