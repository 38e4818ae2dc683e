// make_parallel_optimizer: a kolo::ParallelOptimizer (parallel_optimizer.h)
// from options, DistributedOptimizer at zero_stage 0 and ZeroOptimizer at
// stages 1-3.
#pragma once

#include <memory>

#include "kolo/torch/optimizer.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/zero.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// The factory's options: DistributedOptimizer's (optimizer.h) plus the
// choice of stage. Stages 1-3 take engine, process_set, timeout,
// backward_passes_per_step (1 only), bucket_bytes and name_prefix from the
// same fields, and reject the options they cannot honour (op other than
// kAverage, compression, comm_hook, gradient_predivide_factor;
// gradient_as_bucket_view at stages 2 and 3, which release gradients; stage
// 1 keeps them as views of its buckets anyway) with a ContractError.
struct ParallelOptimizerOptions : DistributedOptimizerOptions {
  int zero_stage = 0;    // 0 = DistributedOptimizer; 1, 2, 3 = ZeroOptimizer stage
  bool prefetch = true;  // stage 3: ZeroOptions::prefetch
};

// Wraps `optimizer` (which must outlive the result) for training `model`
// (whose named_parameters() name the optimizer's parameters). Collective over
// the process set: every rank passes the same model structure and options.
std::unique_ptr<ParallelOptimizer> make_parallel_optimizer(torch::optim::Optimizer& optimizer,
                                                           torch::nn::Module& model,
                                                           const ParallelOptimizerOptions& options);

}  // namespace kolo
#pragma GCC visibility pop
