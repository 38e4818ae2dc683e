// Shared by the ZeRO tests: a model whose parameter sizes do not divide by
// 2, 3 or 4 (fc1: 7x13 + 13, fc2: 13x5 + 5 = 174 elements), each layer a
// kolo::ShardedUnit so that the same model runs at every stage (an unadopted
// unit is its plain layer), and one world's training batch per step.
#pragma once

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/zero.h"
#include "torch_harness.h"

namespace kolo::zero_testing {

struct ZeroNet : torch::nn::Module {
  ZeroNet() {
    fc1 = register_module("fc1", ShardedUnit(torch::nn::Linear(7, 13)));
    fc2 = register_module("fc2", ShardedUnit(torch::nn::Linear(13, 5)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  ShardedUnit fc1{nullptr};
  ShardedUnit fc2{nullptr};
};

// A copy of `source`'s parameters (make models on the test's main thread:
// ranks as threads share torch's default generator).
inline std::shared_ptr<ZeroNet> copy_of(const ZeroNet& source) {
  auto copy = std::make_shared<ZeroNet>();
  torch::NoGradGuard no_grad;
  auto to = copy->parameters();
  auto from = source.parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

struct Batch {
  torch::Tensor x;  // (rows, 7)
  torch::Tensor y;  // (rows) classes in [0, 5)
  // Rank r's equal share of the rows.
  Batch share(int rank, int world) const {
    const int64_t b = x.size(0) / world;
    return {x.slice(0, rank * b, (rank + 1) * b), y.slice(0, rank * b, (rank + 1) * b)};
  }
};

inline std::vector<Batch> make_batches(int steps, int64_t rows) {
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back({torch::randn({rows, 7}), torch::randint(0, 5, {rows}, torch::kLong)});
  }
  return out;
}

inline torch::Tensor loss_of(ZeroNet& model, const Batch& batch) {
  return torch::nn::functional::cross_entropy(model.forward(batch.x), batch.y);
}

enum class Kind { kSgd, kAdam };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind,
                                                               std::vector<torch::Tensor> params) {
  if (kind == Kind::kSgd) {
    return std::make_unique<torch::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  }
  return std::make_unique<torch::optim::Adam>(std::move(params),
                                              torch::optim::AdamOptions(1e-2).weight_decay(1e-3));
}

// ZeroOptions for `stage` on `engine`, with the tests' timeout.
inline ZeroOptions zero_options(int stage, Engine& engine) {
  ZeroOptions o;
  o.stage = stage;
  o.engine = &engine;
  o.timeout = testing::kTorchTimeout;
  return o;
}

// make_parallel_optimizer's options for `stage` on `engine`, with the tests' timeout.
inline ParallelOptimizerOptions factory_options(int stage, Engine& engine) {
  ParallelOptimizerOptions o;
  o.zero_stage = stage;
  o.engine = &engine;
  o.timeout = testing::kTorchTimeout;
  return o;
}

}  // namespace kolo::zero_testing
