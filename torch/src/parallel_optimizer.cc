// ParallelOptimizer (kolo/torch/parallel_optimizer.h): the factory and the
// one checkpoint call.
#include "kolo/torch/parallel_optimizer.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "kolo/core/errors.h"
#include "kolo/torch/optimizer_factory.h"

namespace kolo {

namespace {

// The options a ZeRO stage cannot honour ("" = none).
std::string unsupported_at_zero(const ParallelOptimizerOptions& o) {
  const std::string stage = "zero_stage " + std::to_string(o.zero_stage);
  if (o.op != ReduceOp::kAverage) {
    return "options.op is " + std::string(reduce_op_name(o.op)) + "; " + stage +
           " averages the gradients (ReduceOp::kAverage); use zero_stage 0 for kSum";
  }
  if (o.compression != Compression::kNone) {
    return "options.compression is " + std::string(compression_name(o.compression)) + "; " + stage +
           " reduce-scatters full-precision gradients; use zero_stage 0 or kNone";
  }
  if (o.comm_hook != nullptr) {
    return "options.comm_hook is '" + o.comm_hook->describe() + "'; " + stage +
           " reduce-scatters its flat shard buffers (each rank receives only its slice), which a "
           "communication hook cannot take part in; use zero_stage 0 for hooks";
  }
  if (o.gradient_as_bucket_view && o.zero_stage >= 2) {
    return "options.gradient_as_bucket_view is set; " + stage +
           " releases each gradient once its bucket is handed to the engine (keeping only this "
           "rank's reduced slice), so there is no full bucket for it to be a view of; use "
           "zero_stage 0 or 1 (stage 1 always keeps gradients as views of its buckets)";
  }
  if (o.gradient_predivide_factor != 1.0) {
    return "options.gradient_predivide_factor is " + std::to_string(o.gradient_predivide_factor) +
           "; " + stage + " takes no predivide factor; use zero_stage 0 or 1.0";
  }
  return "";
}

}  // namespace

std::unique_ptr<ParallelOptimizer> make_parallel_optimizer(
    torch::optim::Optimizer& optimizer, torch::nn::Module& model,
    const ParallelOptimizerOptions& options) {
  if (options.zero_stage == 0) {
    return std::make_unique<DistributedOptimizer>(optimizer, model, options);
  }
  if (options.zero_stage < 0 || options.zero_stage > 3) {
    throw ContractError("kolo::make_parallel_optimizer: options.zero_stage is " +
                        std::to_string(options.zero_stage) +
                        "; use 0 (DistributedOptimizer, plain data parallelism) or the ZeRO "
                        "stage 1, 2 or 3");
  }
  // The same on every rank (the options are), so every rank throws.
  const std::string error = unsupported_at_zero(options);
  if (!error.empty()) throw ContractError("kolo::make_parallel_optimizer: " + error);
  ZeroOptions zero;
  static_cast<GradientOptions&>(zero) = options;
  zero.stage = options.zero_stage;
  zero.prefetch = options.prefetch;
  return std::make_unique<ZeroOptimizer>(optimizer, model, zero);
}

void save_checkpoint(const std::string& dir, ParallelOptimizer& optimizer,
                     const CheckpointState& state) {
  optimizer.save(dir, state);
}

CheckpointState load_checkpoint(const std::string& dir, ParallelOptimizer& optimizer) {
  return optimizer.load(dir);
}

}  // namespace kolo
