// Shared by the DistributedOptimizer tests: ranks as threads with one engine
// each, a small model, and element-wise comparison of parameters.
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "../collectives/engine_harness.h"
#include "kolo/core/engine.h"
#include "thread_ranks.h"

namespace kolo::optimizer_testing {

using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;

// A two-layer MLP: (N, 8) -> (N, 4) logits.
struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};

// A copy of `source`'s parameters in a fresh module of the same type (built on
// the calling thread: make every model on the test's main thread, since ranks
// as threads share torch's default generator).
template <typename M>
std::shared_ptr<M> clone_of(const M& source) {
  auto copy = std::make_shared<M>();
  torch::NoGradGuard no_grad;
  auto to = copy->parameters();
  auto from = source.parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

// One step's data for the whole world: rows [rank * B, (rank + 1) * B) are
// rank's batch; one process takes all of them.
struct Batch {
  torch::Tensor x;  // (world * B, 8)
  torch::Tensor y;  // (world * B) class indices in [0, 4)
  torch::Tensor rows(int rank, int64_t b, const torch::Tensor& t) const {
    return t.slice(0, rank * b, (rank + 1) * b);
  }
};

inline std::vector<Batch> make_batches(int steps, int64_t rows) {
  std::vector<Batch> batches;
  for (int s = 0; s < steps; ++s) {
    batches.push_back({torch::randn({rows, 8}), torch::randint(0, 4, {rows}, torch::kLong)});
  }
  return batches;
}

inline torch::Tensor loss_of(Mlp& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}

enum class OptimizerKind { kSgd, kAdam };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind,
                                                               std::vector<torch::Tensor> params,
                                                               double lr) {
  if (kind == OptimizerKind::kSgd) {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(lr).momentum(0.9));
  }
  return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
}

// Every rank's engine work is done before any engine is destroyed (the
// engine's shutdown is collective).
inline void finish(Engine& engine) {
  float x = 0;
  TensorView v{&x, DType::kF32, {}};
  engine.allreduce("test/finish", v, v);
}

// Element-wise |actual - expected| <= atol + rtol * |expected|, reporting the
// worst element.
inline void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const torch::Tensor excess = (actual - expected).abs() - (atol + rtol * expected.abs());
  const double worst = excess.max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": max |actual - expected| = "
                        << (actual - expected).abs().max().item<double>() << " exceeds atol "
                        << atol << " + rtol " << rtol << " * |expected|";
}

inline void expect_params_close(torch::nn::Module& actual, torch::nn::Module& expected, double rtol,
                                double atol, const std::string& what) {
  auto a = actual.named_parameters();
  auto e = expected.named_parameters();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    expect_close(a[i].value(), e[i].value(), rtol, atol, what + " " + a[i].key());
  }
}

}  // namespace kolo::optimizer_testing
