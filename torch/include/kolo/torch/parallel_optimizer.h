// ParallelOptimizer: the one interface of kolo's data-parallel optimizers,
// kolo::DistributedOptimizer (optimizer.h) and kolo::ZeroOptimizer at stages
// 1-3 (zero.h). make_parallel_optimizer (optimizer_factory.h) picks one from
// options, so that switching from data parallelism to ZeRO is one option, not
// a code change:
//
//   torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
//   kolo::ParallelOptimizerOptions options;
//   options.zero_stage = 2;                      // 0 = DistributedOptimizer
//   auto optimizer = kolo::make_parallel_optimizer(adam, *model, options);
//   ...
//   optimizer->zero_grad();
//   loss.backward();     // buckets of gradients start their exchange as they are ready
//   optimizer->step();   // waits for the exchange, steps adam (ZeRO: this rank's slices)
//   kolo::save_checkpoint(dir, *optimizer, {epoch, step});   // collective
//
// Both run the same gradient pipeline (docs/torch.md, "The gradient
// pipeline"): hooks after gradient accumulation, pass counting, buckets
// handed to the engine as their gradients are ready, zero-fill of gradients
// a rank did not produce.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "kolo/torch/checkpoint.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// What every data-parallel optimizer takes (DistributedOptimizerOptions,
// ZeroOptions): where it runs (CallOptions: engine, process set, timeout of
// each wait), and the gradient pipeline's settings.
struct GradientOptions : CallOptions {
  // k >= 1: gradients accumulate locally over k backward passes, a
  // parameter's gradient is final in its k-th pass, and the exchanged result
  // is divided by k (k passes over batches of B, then step(), equal one step
  // on a batch of k * B when each pass's loss is a mean over its batch).
  int backward_passes_per_step = 1;
  // Gradients go to the engine in buckets of about this many bytes (see each
  // optimizer for how buckets are cut); 25 MiB is DDP's bucket_cap_mb.
  int64_t bucket_bytes = 25 << 20;
  // Request names start with this. Two optimizers whose parameters share
  // names (two models' "fc.weight") need different prefixes.
  std::string name_prefix = "grad/";
};

class ParallelOptimizer {
 public:
  virtual ~ParallelOptimizer() = default;

  // Finishes the step's gradient exchange (synchronize(), unless it ran since
  // the last backward pass), then steps the wrapped optimizer (ZeRO: on this
  // rank's slices, then gathers the parameters as its stage needs). Returns
  // what the wrapped step returns. A failed collective is rethrown with the
  // engine's message; the optimizer is not stepped.
  virtual torch::Tensor step() = 0;
  // The exchange without the update: afterwards the gradients the wrapped
  // optimizer steps hold the reduced values (DistributedOptimizer: every
  // parameter's .grad(); ZeroOptimizer: the .grad() of the parameters of
  // optimizer().param_groups(), views of this rank's reduced slices). So a
  // gradient can be clipped or unscaled between synchronize() and step().
  virtual void synchronize() = 0;
  // Clears the gradients for the next step and restarts local accumulation;
  // ContractError while an exchange started by backward() is unwaited or a
  // gradient of this step waits in a bucket (call step() or synchronize()).
  virtual void zero_grad() = 0;

  // The wrapped optimizer (ContractError for a DistributedOptimizer built
  // without one). At ZeRO stages its parameter groups hold this rank's pieces.
  virtual torch::optim::Optimizer& optimizer() = 0;
  virtual int zero_stage() const = 0;  // 0 = DistributedOptimizer
  virtual int rank() const = 0;        // in the process set
  virtual int world_size() const = 0;  // of the process set

 private:
  friend void save_checkpoint(const std::string& dir, ParallelOptimizer& optimizer,
                              const CheckpointState& state);
  friend CheckpointState load_checkpoint(const std::string& dir, ParallelOptimizer& optimizer);
  virtual void save(const std::string& dir, const CheckpointState& state) = 0;
  virtual CheckpointState load(const std::string& dir) = 0;
};

// Collective. Writes the directory `dir` (created if missing) in kolo's
// sharded checkpoint format (docs/zero.md, "Sharded checkpoints"): the
// optimized parameters, the optimizer's state (element-wise, as ZeRO needs;
// a DistributedOptimizer over another optimizer is a ContractError saying to
// use the single-file save_checkpoint), the model's buffers and `state`. At
// zero_stage 0 rank 0 writes everything as one shard, with every rank's
// generator state; at stages 1-3 every rank writes its slices.
void save_checkpoint(const std::string& dir, ParallelOptimizer& optimizer,
                     const CheckpointState& state);
// Collective. Restores what save_checkpoint wrote at any stage and world size
// (and any ZeRO checkpoint); returns the saved state (rng_restored when the
// generator states of a stage-0 save of this world size were restored). A
// missing, corrupt or mismatching file is a ContractError on every rank
// naming the file.
CheckpointState load_checkpoint(const std::string& dir, ParallelOptimizer& optimizer);

}  // namespace kolo
#pragma GCC visibility pop
