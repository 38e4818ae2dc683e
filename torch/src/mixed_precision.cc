// Mixed precision (kolo/torch/mixed_precision.h): autocast and loss scaling.
#include "kolo/torch/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kolo/core/errors.h"
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

}  // namespace

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

AutocastGuard::AutocastGuard(c10::ScalarType dtype, bool enabled)
    : previous_enabled_(at::autocast::is_cpu_enabled()),
      previous_dtype_(at::autocast::get_autocast_cpu_dtype()) {
  if (enabled && dtype != torch::kBFloat16) {
    throw ContractError(std::string("kolo::AutocastGuard: dtype ") + c10::toString(dtype) +
                        "; libtorch autocasts the CPU to BFloat16 only (torch::kBFloat16)");
  }
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Leaving the outermost region frees the casts of the weights autocast
  // cached for it (as torch.autocast's __exit__).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(previous_enabled_);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
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
