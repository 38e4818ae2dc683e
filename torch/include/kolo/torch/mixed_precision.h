// Mixed precision on the CPU: bf16 autocast for the forward pass, and
// dynamic loss scaling (PyTorch's GradScaler, Keras' LossScaleOptimizer)
// over any kolo::ParallelOptimizer (docs/torch.md, "Mixed precision").
//
//   kolo::LossScaler scaler;  // 2^16; halve on overflow, x2 after 2000 clean steps
//   for (...) {
//     optimizer->zero_grad();
//     torch::Tensor loss;
//     {
//       kolo::AutocastGuard autocast(torch::kBFloat16);  // matmuls and convolutions in bf16
//       loss = loss_fn(model->forward(x), y);
//     }
//     scaler.scale(loss).backward();             // gradients of loss * scale
//     scaler.step(*optimizer);                   // unscale; step, or skip if any rank overflowed
//   }
//   state.extras = scaler.extras();              // the scale goes into checkpoints
//
// Why scale: fp16 gradients smaller than 2^-24 flush to zero; multiplying the
// loss by S multiplies every gradient by S, which keeps them representable,
// and the optimizer sees them divided by S again. Too large an S overflows to
// inf: that step is skipped and S halved. bf16 has fp32's exponent range, so
// bf16 training usually needs no scaling (options.enabled = false keeps the
// same loop with S = 1 and no check).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kolo/torch/tensor.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class ParallelOptimizer;

// The arithmetic a model trains in: "fp32" (float32 throughout), "bf16"
// (bf16 autocast of the forward pass; float32 parameters, gradients and
// optimizer state), "fp16" (float16 is not autocast on the CPU by libtorch
// 1.13: a model converted to float16 by the user, with loss scaling).
enum class Precision { kFp32, kBf16, kFp16 };
// "fp32", "bf16", "fp16"; ContractError listing them otherwise.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

// While alive, operations on this thread that autocast supports run in
// `dtype` (libtorch's CPU autocast: convolutions, linear layers and matmuls
// in bf16; reductions, losses and softmax in float32). Restores the previous
// autocast state when destroyed; nests. Only the forward pass belongs inside:
// backward runs each operation in the dtype its forward used. libtorch 1.13
// autocasts the CPU to bf16 only: another dtype is a ContractError.
class AutocastGuard {
 public:
  // `device`: the device type whose autocast state the region sets (kCPU or
  // kCUDA; CUDA also autocasts to kHalf).
  explicit AutocastGuard(c10::ScalarType dtype = torch::kBFloat16, bool enabled = true,
                         c10::DeviceType device = c10::DeviceType::CPU);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

// Low-precision model, float32 master weights (Micikevicius et al., "Mixed
// Precision Training"; Apex O2; DeepSpeed). The model's parameters are
// float16 or bfloat16 (forward and backward run in it, gradients are
// exchanged in it: half the bytes); the update runs on float32 copies, so
// updates smaller than half a unit of the low precision accumulate instead
// of rounding away:
//
//   model->to(torch::kBFloat16);
//   torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
//   kolo::MasterWeightOptimizer master(adam);     // steps float32 copies
//   auto optimizer = kolo::make_parallel_optimizer(master, *model, options);
//
// A torch::optim::Optimizer over the same parameter groups as `inner` (its
// group options are this optimizer's: LR schedules and apply_lr change them
// here). Each step, for every parameter p of its groups: the float32 master
// copy m (made from p at its first step) receives p's gradient in float32,
// `inner` steps m (its state, e.g. Adam's moments, is float32 and lives
// with m), and p takes m's value rounded to p's dtype. Under a ZeroOptimizer
// the parameters of its groups are this rank's slices, so the master weights
// and their optimizer state are sharded like the rest (DeepSpeed's layout):
// per parameter element, stage 3 with Adam holds 2/N bytes of bf16
// parameters, 2/N of gradients, and (4 + 8)/N of master weights and moments.
//
// State. The state of p (state() keyed by p, as every optimizer's) is a
// MasterParamState: m and inner's state of m. Checkpoints (kolo's sharded and
// single-file ones, elastic commits) therefore save the master weights with
// full precision, element-wise, sharded at ZeRO stages. The wrapped optimizer
// must not have stepped (its state empty) and must outlive this one; use
// this one from then on. step() takes no closure.
class MasterParamState : public torch::optim::OptimizerParamState {
 public:
  torch::Tensor master;                                      // float32, shaped like the parameter
  std::unique_ptr<torch::optim::OptimizerParamState> inner;  // inner's state of master (or none)

  std::unique_ptr<torch::optim::OptimizerParamState> clone() const override;
  // "master" and inner's entries, in one archive.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  void serialize(torch::serialize::InputArchive& archive) override;
};

class MasterWeightOptimizer : public torch::optim::Optimizer {
 public:
  explicit MasterWeightOptimizer(torch::optim::Optimizer& inner);
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Every parameter's MasterParamState, by position in the groups.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  torch::optim::Optimizer& inner() { return inner_; }

 private:
  torch::optim::Optimizer& inner_;
};

// Where the overflow vote runs (CallOptions: engine, process set, timeout:
// those of the optimizer the scaler steps), and GradScaler's parameters.
struct LossScalerOptions : CallOptions {
  double init_scale = 65536.0;     // 2^16 > 0
  double growth_factor = 2.0;      // > 1: the scale after growth_interval clean steps in a row
  double backoff_factor = 0.5;     // in (0, 1): the scale after a step that overflowed
  int64_t growth_interval = 2000;  // >= 1
  bool enabled = true;             // false: scale() and unscale are identities, never skips
  // Request name of the overflow vote (two scalers stepping at the same time
  // need different names).
  std::string name = "loss_scaler";
};

class LossScaler {
 public:
  // ContractError naming the option for an invalid one.
  explicit LossScaler(LossScalerOptions options = {});

  // loss * scale() (the loss itself when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;

  // Collective over options.process_set, once per step: optimizer.synchronize()
  // (the reduced gradients are then in the .grad() of the tensors the wrapped
  // optimizer steps: every parameter, or at a ZeRO stage this rank's slices),
  // divides them by the scale, and votes: whether any rank saw an inf or NaN
  // in its gradients (a one-element allreduce with kMax, so every rank gets
  // the same answer even when each one checks only its own ZeRO slices).
  // Returns true when the step must be skipped. A second call in the same
  // step returns the first answer without dividing again (unscale to clip
  // gradients between unscale() and step(), as GradScaler.unscale_).
  bool unscale(ParallelOptimizer& optimizer);
  // unscale() unless it ran this step, then optimizer.step() when no rank
  // overflowed, and update(). Returns whether the optimizer stepped (the same
  // on every rank). A skipped step leaves parameters and optimizer state as
  // they were; zero_grad() then starts the next step as usual.
  bool step(ParallelOptimizer& optimizer);

  double scale_value() const { return scale_; }
  // Clean steps since the last overflow or growth.
  int64_t growth_tracker() const { return growth_tracker_; }
  // Steps skipped since construction (not checkpointed).
  int64_t skipped_steps() const { return skipped_; }
  const LossScalerOptions& options() const { return options_; }

  // The scale and growth tracker as CheckpointState::extras entries
  // ("kolo.loss_scale", "kolo.loss_scale_growth"), exact (hex float), and back:
  // merge them into the state given to save_checkpoint or an elastic commit,
  // and restore them from the state load_checkpoint returns. restore() of
  // extras without them leaves the scaler as it is; a malformed entry is a
  // ContractError naming it.
  std::map<std::string, std::string> extras() const;
  void restore(const std::map<std::string, std::string>& extras);

 private:
  // After a step: halve on overflow, grow after growth_interval clean steps.
  void update(bool overflowed);

  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
  // unscale() ran for this step (reset by step()), and what it found.
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace kolo
#pragma GCC visibility pop
