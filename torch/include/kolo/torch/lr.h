// Learning-rate helpers for data-parallel training.
//
// Linear scaling (Goyal et al., "Accurate, Large Minibatch SGD", 2017): with n
// workers the global batch is n times larger, so the learning rate is n times
// larger too; to avoid early instability it is reached by a linear warmup
// from the single-worker rate over the first K epochs, per step. After the
// warmup the rate stays constant, decays in steps, or follows a cosine to a
// floor.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// base_lr * world_size (linear scaling rule). ContractError for world_size < 1.
double scaled_lr(double base_lr, int world_size);

enum class LrDecay {
  kConstant,  // peak_lr after the warmup
  kStep,      // peak_lr * step_factor ^ floor(epoch / step_epochs)
  kCosine,    // peak_lr down to min_lr along half a cosine, from warmup end to total_epochs
};

struct LrScheduleOptions {
  double base_lr = 0.1;         // at epoch 0 (the single-worker rate)
  double peak_lr = 0.1;         // at the end of the warmup (e.g. scaled_lr(base_lr, size))
  double warmup_epochs = 0;     // K; 0 = start at peak_lr
  int64_t steps_per_epoch = 1;  // optimizer steps per epoch (per-step granularity)
  LrDecay decay = LrDecay::kConstant;
  // kStep: multiply by step_factor every step_epochs epochs, counted from
  // epoch 0 as torch's StepLR and Goyal et al. (decay at 30, 60, 80 ...); the
  // warmup takes precedence before warmup_epochs.
  double step_epochs = 30;
  double step_factor = 0.1;
  // kCosine: the rate reaches min_lr at total_epochs and stays there.
  double total_epochs = 90;
  double min_lr = 0;
};

class LrSchedule {
 public:
  // ContractError for steps_per_epoch < 1, negative warmup, step_epochs <= 0,
  // or (cosine) total_epochs <= warmup_epochs.
  explicit LrSchedule(const LrScheduleOptions& options);

  // The rate at a fractional epoch (epoch 2.5 = half way through the third):
  //  e < K:  base_lr + (peak_lr - base_lr) * e / K
  //  e >= K: the decay rule above.
  double lr(double epoch) const;
  // The rate for step `step` (0-based) of epoch `epoch`:
  // lr(epoch + step / steps_per_epoch).
  double lr(int64_t epoch, int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

// Sets the learning rate of every parameter group of `optimizer`. Knows SGD,
// Adam, AdamW, RMSprop, Adagrad and LBFGS, and any optimizer whose options
// override OptimizerOptions::set_lr; any other is a ContractError.
void apply_lr(torch::optim::Optimizer& optimizer, double lr);
// The same for parameter group `group` only.
void apply_lr(torch::optim::Optimizer& optimizer, size_t group, double lr);
// The learning rate of parameter group `group` (same optimizers).
double current_lr(const torch::optim::Optimizer& optimizer, size_t group = 0);

}  // namespace kolo
#pragma GCC visibility pop
