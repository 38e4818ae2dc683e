// Mixed precision (kolo/torch/mixed_precision.h): autocast and loss scaling.
#include "kolo/torch/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"
#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"
#include "kolo/torch/parallel_optimizer.h"

namespace kolo {

namespace {

constexpr const char* kScaleKey = "kolo.loss_scale";
constexpr const char* kGrowthKey = "kolo.loss_scale_growth";

// A double as C's exact hexadecimal form ("0x1p+16"), and back.
std::string exact(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a", value);
  return text;
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(torch::optim::Optimizer& inner) {
  if (!inner.state().empty()) {
    throw ContractError(
        "kolo::MasterWeightOptimizer: the wrapped optimizer has stepped (its state is not "
        "empty); wrap it before its first step, its state would belong to the low-precision "
        "parameters");
  }
  return inner.param_groups();
}

}  // namespace

std::unique_ptr<torch::optim::OptimizerParamState> MasterParamState::clone() const {
  auto copy = std::make_unique<MasterParamState>();
  if (master.defined()) copy->master = master.clone();
  if (inner) copy->inner = inner->clone();
  return copy;
}

void MasterParamState::serialize(torch::serialize::OutputArchive& archive) const {
  if (master.defined()) archive.write("master", master);
  if (inner) inner->serialize(archive);
}

void MasterParamState::serialize(torch::serialize::InputArchive& archive) {
  torch::Tensor saved;
  if (archive.try_read("master", saved)) {
    if (master.defined() && master.sizes() == saved.sizes()) {
      torch::NoGradGuard no_grad;
      master.copy_(saved);
    } else {
      master = saved.to(torch::kFloat).clone();
    }
  }
  // The inner optimizer's entries, when the archive has any besides ours.
  bool others = false;
  for (const std::string& key : archive.keys())
    others = others || (key != "master" && key != "training");
  if (inner && others) inner->serialize(archive);
}

MasterWeightOptimizer::MasterWeightOptimizer(torch::optim::Optimizer& inner)
    : torch::optim::Optimizer(groups_of(inner), inner.defaults().clone()), inner_(inner) {}

torch::Tensor MasterWeightOptimizer::step(LossClosure closure) {
  if (closure) {
    throw ContractError(
        "kolo::MasterWeightOptimizer::step: a closure is not supported (the loss would be "
        "evaluated with the low-precision parameters mid-step); call step() without one");
  }
  auto& inner_groups = inner_.param_groups();
  if (inner_groups.size() != param_groups_.size()) {
    throw ContractError("kolo::MasterWeightOptimizer::step: the wrapped optimizer has " +
                        std::to_string(inner_groups.size()) + " parameter groups, this one " +
                        std::to_string(param_groups_.size()) +
                        "; add parameter groups to the MasterWeightOptimizer only");
  }
  torch::NoGradGuard no_grad;
  // Each parameter's master copy takes its place in the inner optimizer for
  // this step, with the gradient in float32 and the inner state it left.
  std::vector<std::pair<torch::Tensor, MasterParamState*>> stepped;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    inner_groups[g].set_options(param_groups_[g].options().clone());
    std::vector<torch::Tensor> masters;
    for (const torch::Tensor& p : param_groups_[g].params()) {
      auto& slot = state_[compat::optimizer_state_key(p)];
      if (!slot) slot = std::make_unique<MasterParamState>();
      auto* s = dynamic_cast<MasterParamState*>(slot.get());
      if (s == nullptr) {
        throw ContractError(
            "kolo::MasterWeightOptimizer::step: the state of a parameter is not a "
            "MasterParamState (was it loaded from another optimizer's checkpoint?)");
      }
      if (!s->master.defined()) s->master = p.detach().to(torch::kFloat).clone();
      s->master.mutable_grad() = p.grad().defined() ? p.grad().to(torch::kFloat) : torch::Tensor();
      if (s->inner) inner_.state()[compat::optimizer_state_key(s->master)] = std::move(s->inner);
      masters.push_back(s->master);
      stepped.emplace_back(p, s);
    }
    inner_groups[g].params() = std::move(masters);
  }
  // Whatever happens, the inner state goes back to its parameter.
  const auto give_back = [&] {
    for (auto& [p, s] : stepped) {
      auto it = inner_.state().find(compat::optimizer_state_key(s->master));
      if (it != inner_.state().end()) s->inner = std::move(it->second);
      s->master.mutable_grad() = torch::Tensor();
    }
    inner_.state().clear();
  };
  torch::Tensor result;
  try {
    result = inner_.step();
  } catch (...) {
    give_back();
    throw;
  }
  give_back();
  for (auto& [p, s] : stepped) p.copy_(s->master);
  return result;
}

void MasterWeightOptimizer::save(torch::serialize::OutputArchive& archive) const {
  int64_t index = 0;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& p : group.params()) {
      auto it = state_.find(compat::optimizer_state_key(p));
      if (it != state_.end()) {
        torch::serialize::OutputArchive one(archive.compilation_unit());
        it->second->serialize(one);
        archive.write("state/" + std::to_string(index), one);
      }
      ++index;
    }
  }
  archive.write("params", c10::IValue(index));
}

void MasterWeightOptimizer::load(torch::serialize::InputArchive& archive) {
  std::vector<torch::Tensor> params;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& p : group.params()) params.push_back(p);
  }
  c10::IValue count;
  if (!archive.try_read("params", count) || !count.isInt() ||
      count.toInt() != static_cast<int64_t>(params.size())) {
    throw ContractError(
        "kolo::MasterWeightOptimizer::load: the archive does not hold the state "
        "of " +
        std::to_string(params.size()) + " parameters written by a MasterWeightOptimizer");
  }
  // The inner optimizer creates its state (of its own type) in a step on zero
  // gradients whose change to the parameters is undone; the saved values
  // then overwrite it, the master weights included.
  torch::NoGradGuard no_grad;
  state_.clear();
  std::vector<torch::Tensor> values, grads;
  for (torch::Tensor& p : params) {
    values.push_back(p.clone());
    grads.push_back(p.grad());
    p.mutable_grad() = torch::zeros_like(p);
  }
  step();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_(values[i]);
    params[i].mutable_grad() = grads[i];
    torch::serialize::InputArchive one;
    const auto key = compat::optimizer_state_key(params[i]);
    if (archive.try_read("state/" + std::to_string(i), one)) {
      state_.at(key)->serialize(one);
    } else {
      state_.erase(key);
    }
  }
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  throw ContractError("unknown precision \"" + name + "\"; use fp32, bf16 or fp16");
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

AutocastGuard::AutocastGuard(c10::ScalarType dtype, bool enabled, c10::DeviceType device)
    : device_(device),
      previous_enabled_(compat::autocast_enabled(device)),
      previous_dtype_(compat::autocast_dtype(device)) {
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) {
    throw ContractError(std::string("kolo::AutocastGuard: device type ") +
                        c10::DeviceTypeName(device) + "; kolo autocasts the CPU and CUDA");
  }
  if (enabled && device == c10::DeviceType::CPU && dtype != torch::kBFloat16) {
    throw ContractError(std::string("kolo::AutocastGuard: dtype ") + c10::toString(dtype) +
                        "; libtorch autocasts the CPU to BFloat16 only (torch::kBFloat16)");
  }
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Leaving the outermost region frees the casts of the weights autocast
  // cached for it (as torch.autocast's __exit__).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

LossScaler::LossScaler(LossScalerOptions options) : options_(std::move(options)) {
  const auto bad = [](const std::string& what) {
    throw ContractError("kolo::LossScaler: options." + what);
  };
  if (!(options_.init_scale > 0) || !std::isfinite(options_.init_scale)) {
    bad("init_scale is " + std::to_string(options_.init_scale) + "; use a finite scale > 0");
  }
  if (!(options_.growth_factor > 1)) {
    bad("growth_factor is " + std::to_string(options_.growth_factor) + "; use a factor > 1");
  }
  if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1)) {
    bad("backoff_factor is " + std::to_string(options_.backoff_factor) +
        "; use a factor in (0, 1)");
  }
  if (options_.growth_interval < 1) {
    bad("growth_interval is " + std::to_string(options_.growth_interval) +
        "; use a number of steps >= 1");
  }
  if (options_.name.empty()) bad("name is empty; name the overflow vote's request");
  scale_ = options_.enabled ? options_.init_scale : 1.0;
}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

bool LossScaler::unscale(ParallelOptimizer& optimizer) {
  if (unscaled_) return found_inf_;
  optimizer.synchronize();
  unscaled_ = true;
  found_inf_ = false;
  if (!options_.enabled) return false;
  // Every rank's gradients are checked where they are final: all of them
  // under DistributedOptimizer (identical on every rank: an inf anywhere
  // reached every rank through the sum), only this rank's slices at a ZeRO
  // stage; the vote below makes the answer the same everywhere either way.
  const double inverse = 1.0 / scale_;
  bool local_inf = false;
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.optimizer().param_groups()) {
    for (auto& param : group.params()) {
      torch::Tensor grad = param.mutable_grad();
      if (!grad.defined() || grad.numel() == 0) continue;
      grad.mul_(inverse);
      if (!local_inf && !torch::isfinite(grad).all().item<bool>()) local_inf = true;
    }
  }
  TensorOpOptions vote;
  static_cast<CallOptions&>(vote) = options_;
  vote.op = ReduceOp::kMax;
  const torch::Tensor flag = torch::full({1}, local_inf ? 1.0f : 0.0f, torch::kFloat);
  found_inf_ = allreduce(flag, options_.name + "/found_inf", vote).item<float>() > 0;
  return found_inf_;
}

bool LossScaler::step(ParallelOptimizer& optimizer) {
  const bool overflowed = unscale(optimizer);
  unscaled_ = false;
  if (!overflowed) optimizer.step();  // synchronize() ran: step() does not exchange again
  update(overflowed);
  return !overflowed;
}

void LossScaler::update(bool overflowed) {
  if (!options_.enabled) return;
  if (overflowed) {
    ++skipped_;
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // as GradScaler: never grow to inf
    growth_tracker_ = 0;
  }
}

std::map<std::string, std::string> LossScaler::extras() const {
  return {{kScaleKey, exact(scale_)}, {kGrowthKey, std::to_string(growth_tracker_)}};
}

void LossScaler::restore(const std::map<std::string, std::string>& extras) {
  const auto scale = extras.find(kScaleKey);
  if (scale == extras.end()) return;
  const auto malformed = [](const std::string& key, const std::string& value) {
    throw ContractError("kolo::LossScaler::restore: extras[\"" + key + "\"] is \"" + value +
                        "\", not what LossScaler::extras() writes; the checkpoint's state is "
                        "damaged or was written by something else");
  };
  char* end = nullptr;
  const double value = std::strtod(scale->second.c_str(), &end);
  if (scale->second.empty() || *end != '\0' || !(value > 0) || !std::isfinite(value)) {
    malformed(kScaleKey, scale->second);
  }
  int64_t growth = 0;
  const auto tracker = extras.find(kGrowthKey);
  if (tracker != extras.end()) {
    end = nullptr;
    growth = std::strtoll(tracker->second.c_str(), &end, 10);
    if (tracker->second.empty() || *end != '\0' || growth < 0) {
      malformed(kGrowthKey, tracker->second);
    }
  }
  scale_ = value;
  growth_tracker_ = growth;
  unscaled_ = false;
}

}  // namespace kolo
