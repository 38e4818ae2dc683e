// The example's choice of gradient exchange (--zero-stage): kolo's
// DistributedOptimizer (0, plain data parallelism) or its ZeroOptimizer
// (1, 2, 3: optimizer state, + gradients, + parameters sharded across the
// workers; see docs/zero.md), with the start (broadcast or resume) and the
// checkpoints each needs.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kolo/torch.h"

namespace fashion_mnist {

struct TrainingOptimizerOptions {
  int zero_stage = 0;                // 0 = DistributedOptimizer
  std::string compression = "none";  // DistributedOptimizer only
  std::string checkpoint_dir;        // "" = no checkpoints
  bool resume = false;
};

class TrainingOptimizer {
 public:
  // Wraps `adam` and starts every worker at the same point: from the
  // checkpoint with options.resume, else from rank 0's weights (broadcast
  // before a ZeroOptimizer shards them). Collective.
  TrainingOptimizer(torch::optim::Adam& adam, torch::nn::Module& model,
                    const TrainingOptimizerOptions& options)
      : adam_(adam), model_(model), options_(options) {
    if (options.zero_stage == 0) {
      kolo::DistributedOptimizerOptions dist_options;
      dist_options.compression = kolo::parse_compression(options.compression);
      data_parallel_ = std::make_unique<kolo::DistributedOptimizer>(adam, model.named_parameters(),
                                                                    dist_options);
      if (options.resume) {
        // Rank 0 reads and verifies the file; every worker gets its contents.
        resume([&] { resumed_ = kolo::load_checkpoint(path(), model, &adam); });
      } else {
        kolo::broadcast_parameters(model, /*root=*/0);
        kolo::broadcast_optimizer_state(adam, /*root=*/0);
      }
      return;
    }
    if (!options.resume) kolo::broadcast_parameters(model, /*root=*/0);
    kolo::ZeroOptions zero_options;
    zero_options.stage = options.zero_stage;
    zero_ = std::make_unique<kolo::ZeroOptimizer>(adam, model, zero_options);
    // Every worker reads the shards holding its slices (any earlier world size).
    if (options.resume) resume([&] { resumed_ = kolo::load_zero_checkpoint(path(), *zero_); });
  }

  void zero_grad() { zero_ ? zero_->zero_grad() : data_parallel_->zero_grad(); }
  // Waits for the averaged gradients (or this worker's reduced slices), then steps Adam.
  void step() { zero_ ? zero_->step() : data_parallel_->step(); }

  // Rank 0 writes <dir>/checkpoint.kolo (stage 0), or every worker its shard
  // of <dir>/zero/ (stages 1-3). Collective.
  void save(const kolo::CheckpointState& state) {
    if (zero_) {
      kolo::save_zero_checkpoint(path(), *zero_, state);
    } else {
      kolo::save_checkpoint(path(), model_, &adam_, state);
    }
  }

  // Where checkpoints go.
  std::string path() const { return path_for(options_.zero_stage); }
  std::string path_for(int zero_stage) const {
    return options_.checkpoint_dir + (zero_stage == 0 ? "/checkpoint.kolo" : "/zero");
  }
  // The saved state when resumed.
  const kolo::CheckpointState& resumed() const { return resumed_; }

 private:
  // Runs a collective load. When it fails (the same error on every worker)
  // because --checkpoint-dir holds the other kind of checkpoint, the error
  // says which --zero-stage resumes it.
  template <typename Load>
  void resume(Load load) {
    try {
      load();
    } catch (const kolo::ContractError& e) {
      namespace fs = std::filesystem;
      const bool zero = options_.zero_stage != 0;
      std::error_code ignored;
      if (zero && !fs::exists(path() + "/index.kolo", ignored) &&
          fs::exists(path_for(0), ignored)) {
        throw kolo::ContractError(std::string(e.what()) + "; " + options_.checkpoint_dir +
                                  " holds a plain checkpoint (" + path_for(0) +
                                  ", saved without --zero-stage): resume it without "
                                  "--zero-stage (or with --zero-stage 0)");
      }
      if (!zero && !fs::exists(path(), ignored) &&
          fs::exists(path_for(1) + "/index.kolo", ignored)) {
        throw kolo::ContractError(std::string(e.what()) + "; " + options_.checkpoint_dir +
                                  " holds a sharded ZeRO checkpoint (" + path_for(1) +
                                  "/): resume it with --zero-stage 1, 2 or 3");
      }
      throw;
    }
  }

  torch::optim::Adam& adam_;
  torch::nn::Module& model_;
  TrainingOptimizerOptions options_;
  std::unique_ptr<kolo::DistributedOptimizer> data_parallel_;
  std::unique_ptr<kolo::ZeroOptimizer> zero_;
  kolo::CheckpointState resumed_;
};

}  // namespace fashion_mnist
