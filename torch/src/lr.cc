// Learning-rate helpers (kolo/torch/lr.h).
#include "kolo/torch/lr.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <string>
#include <typeinfo>

#include "kolo/core/errors.h"

namespace kolo {

double scaled_lr(double base_lr, int world_size) {
  if (world_size < 1) {
    throw ContractError("kolo::scaled_lr: world_size " + std::to_string(world_size) +
                        " must be at least 1");
  }
  return base_lr * world_size;
}

LrSchedule::LrSchedule(const LrScheduleOptions& options) : options_(options) {
  const std::string op = "kolo::LrSchedule: ";
  if (options.steps_per_epoch < 1) {
    throw ContractError(op + "steps_per_epoch " + std::to_string(options.steps_per_epoch) +
                        " must be at least 1 (optimizer steps per epoch)");
  }
  if (!(options.warmup_epochs >= 0)) {
    throw ContractError(op + "warmup_epochs " + std::to_string(options.warmup_epochs) +
                        " must be >= 0");
  }
  if (options.decay == LrDecay::kStep && !(options.step_epochs > 0)) {
    throw ContractError(op + "step_epochs " + std::to_string(options.step_epochs) +
                        " must be > 0 for step decay");
  }
  if (options.decay == LrDecay::kCosine && !(options.total_epochs > options.warmup_epochs)) {
    throw ContractError(op + "total_epochs " + std::to_string(options.total_epochs) +
                        " must be greater than warmup_epochs " +
                        std::to_string(options.warmup_epochs) + " for cosine decay");
  }
}

double LrSchedule::lr(double epoch) const {
  const LrScheduleOptions& o = options_;
  if (epoch < o.warmup_epochs) {
    return o.base_lr + (o.peak_lr - o.base_lr) * (epoch / o.warmup_epochs);
  }
  switch (o.decay) {
    case LrDecay::kConstant:
      return o.peak_lr;
    case LrDecay::kStep:
      return o.peak_lr * std::pow(o.step_factor, std::floor(epoch / o.step_epochs));
    case LrDecay::kCosine: {
      const double progress =
          std::min(1.0, (epoch - o.warmup_epochs) / (o.total_epochs - o.warmup_epochs));
      return o.min_lr + (o.peak_lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
  }
  return o.peak_lr;
}

double LrSchedule::lr(int64_t epoch, int64_t step) const {
  return lr(static_cast<double>(epoch) +
            static_cast<double>(step) / static_cast<double>(options_.steps_per_epoch));
}

namespace {

constexpr const char* kKnownOptimizers = "SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS";

// Calls fn(options) with the group's options cast to its concrete type, or
// falls back to the virtual get_lr/set_lr; ContractError when neither works.
template <typename Fn>
void with_lr_options(torch::optim::OptimizerOptions& options, const std::string& op, Fn fn) {
  using namespace torch::optim;
  if (auto* o = dynamic_cast<SGDOptions*>(&options)) return fn(o->lr());
  if (auto* o = dynamic_cast<AdamOptions*>(&options)) return fn(o->lr());
  if (auto* o = dynamic_cast<AdamWOptions*>(&options)) return fn(o->lr());
  if (auto* o = dynamic_cast<RMSpropOptions*>(&options)) return fn(o->lr());
  if (auto* o = dynamic_cast<AdagradOptions*>(&options)) return fn(o->lr());
  if (auto* o = dynamic_cast<LBFGSOptions*>(&options)) return fn(o->lr());
  // A custom optimizer: its options may override get_lr / set_lr.
  double lr = 0;
  try {
    lr = options.get_lr();
  } catch (const std::exception&) {
    throw ContractError(op + ": the optimizer's options are of an unknown type (" +
                        typeid(options).name() + "); supported: " + kKnownOptimizers +
                        ", or options that override OptimizerOptions::get_lr/set_lr");
  }
  fn(lr);
  options.set_lr(lr);
}

}  // namespace

void apply_lr(torch::optim::Optimizer& optimizer, double lr) {
  const std::string op = "kolo::apply_lr";
  for (auto& group : optimizer.param_groups()) {
    if (!group.has_options()) {
      throw ContractError(op + ": a parameter group has no options");
    }
    with_lr_options(group.options(), op, [lr](double& value) { value = lr; });
  }
}

void apply_lr(torch::optim::Optimizer& optimizer, size_t group, double lr) {
  const std::string op = "kolo::apply_lr";
  auto& groups = optimizer.param_groups();
  if (group >= groups.size() || !groups[group].has_options()) {
    throw ContractError(op + ": group " + std::to_string(group) +
                        (group >= groups.size()
                             ? " does not exist (the optimizer has " +
                                   std::to_string(groups.size()) + " parameter groups)"
                             : " has no options"));
  }
  with_lr_options(groups[group].options(), op, [lr](double& value) { value = lr; });
}

double current_lr(const torch::optim::Optimizer& optimizer, size_t group) {
  const std::string op = "kolo::current_lr";
  const auto& groups = optimizer.param_groups();
  if (group >= groups.size()) {
    throw ContractError(op + ": group " + std::to_string(group) +
                        " does not exist (the optimizer has " + std::to_string(groups.size()) +
                        " parameter groups)");
  }
  // The options are only read; with_lr_options takes them mutable.
  auto& options = const_cast<torch::optim::OptimizerOptions&>(groups[group].options());
  double result = 0;
  with_lr_options(options, op, [&result](double& value) { result = value; });
  return result;
}

}  // namespace kolo
