// kolo::TorchOptimizer: a DistributedOptimizer through libtorch's optimizer
// interface. Two ranks whose training loop sees only a
// torch::optim::Optimizer&, with libtorch's StepLR scheduling it, train as
// one process with the whole batch and the same schedule; a rate set on
// either side reaches the other; what cannot work across ranks (a loss
// closure, torch::save of the optimizer, no wrapped optimizer) is a
// ContractError.
#include "kolo/torch/torch_optimizer.h"

#include <gtest/gtest.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/torch.h>

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/lr.h"
#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;

constexpr int kSteps = 5;
constexpr int64_t kBatch = 6;  // rows per rank
constexpr double kLr = 0.1;

// The loop of a program written against libtorch alone.
void train(torch::optim::Optimizer& optimizer, torch::optim::StepLR& schedule, ot::Mlp& model,
           const std::vector<ot::Batch>& batches, int rank, int world) {
  for (const ot::Batch& batch : batches) {
    optimizer.zero_grad();
    const int64_t rows = batch.x.size(0) / world;
    ot::loss_of(model, batch.x.slice(0, rank * rows, (rank + 1) * rows),
                batch.y.slice(0, rank * rows, (rank + 1) * rows))
        .backward();
    optimizer.step();
    schedule.step();
  }
}

TEST(TorchOptimizer, TwoRanksThroughLibtorchsInterfaceAndStepLRMatchOneProcess) {
  torch::set_num_threads(1);
  torch::manual_seed(11);
  ot::Mlp initial;
  const auto batches = ot::make_batches(kSteps, 2 * kBatch);

  auto expected = ot::clone_of(initial);
  torch::optim::SGD single(expected->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  torch::optim::StepLR single_schedule(single, /*step_size=*/2, /*gamma=*/0.5);
  train(single, single_schedule, *expected, batches, 0, 1);

  ot::EngineWorld world("threads", 2);
  std::vector<std::shared_ptr<ot::Mlp>> models = {ot::clone_of(initial), ot::clone_of(initial)};
  std::vector<double> final_lr(2, 0);
  ot::run_ranks(2, [&](int rank) {
    auto engine = world.engine(rank);
    ot::Mlp& model = *models[rank];
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
    DistributedOptimizerOptions options;
    options.engine = engine.get();
    options.timeout = ot::kEngineTimeout;
    DistributedOptimizer distributed(sgd, model.named_parameters(), options);
    TorchOptimizer optimizer(distributed);
    torch::optim::StepLR schedule(optimizer, /*step_size=*/2, /*gamma=*/0.5);
    train(optimizer, schedule, model, batches, rank, 2);
    EXPECT_EQ(distributed.stats().steps, static_cast<size_t>(kSteps));
    final_lr[rank] = current_lr(optimizer);
    ot::finish(*engine);
  });
  for (int r = 0; r < 2; ++r) {
    ot::expect_params_close(*models[r], *expected, 1e-5, 1e-6, "rank " + std::to_string(r));
    EXPECT_DOUBLE_EQ(final_lr[r], current_lr(single)) << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(current_lr(single), kLr * 0.25);
  // The schedule changed the rate mid-run (the comparison is not vacuous).
  EXPECT_GT((expected->fc1->weight - initial.fc1->weight).abs().max().item<double>(), 1e-3);
}

// One rank: SGD under a DistributedOptimizer under a TorchOptimizer.
struct OneRank {
  ot::Mlp model;
  ot::EngineWorld world{"threads", 1};
  std::unique_ptr<Engine> engine = world.engine(0);
  torch::optim::SGD sgd{model.parameters(), torch::optim::SGDOptions(kLr)};
  DistributedOptimizerOptions options = [this] {
    DistributedOptimizerOptions o;
    o.engine = engine.get();
    return o;
  }();
  DistributedOptimizer distributed{sgd, model.named_parameters(), options};
  TorchOptimizer optimizer{distributed};
  ~OneRank() { ot::finish(*engine); }
};

TEST(TorchOptimizer, ARateSetOnEitherSideIsTheNextStepsRate) {
  torch::manual_seed(12);
  OneRank one;
  ot::Mlp& model = one.model;
  TorchOptimizer& optimizer = one.optimizer;
  torch::optim::SGD& sgd = one.sgd;
  const ot::Batch batch = ot::make_batches(1, kBatch)[0];
  auto step = [&] {
    optimizer.zero_grad();
    ot::loss_of(model, batch.x, batch.y).backward();
    optimizer.step();
  };
  apply_lr(optimizer, 0.01);  // as a scheduler does
  step();
  EXPECT_DOUBLE_EQ(current_lr(sgd), 0.01);
  apply_lr(sgd, 0.002);  // on the wrapped optimizer
  step();
  EXPECT_DOUBLE_EQ(current_lr(optimizer), 0.002);
  EXPECT_DOUBLE_EQ(current_lr(sgd), 0.002);
}

TEST(TorchOptimizer, WhatCannotRunAcrossRanksIsAContractError) {
  torch::manual_seed(13);
  OneRank one;
  ot::Mlp& model = one.model;
  TorchOptimizer& optimizer = one.optimizer;
  const DistributedOptimizerOptions& options = one.options;
  EXPECT_THROW(optimizer.step([] { return torch::zeros({}); }), ContractError);
  std::ostringstream out;
  EXPECT_THROW(torch::save(optimizer, out), ContractError);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model.named_parameters()) named.emplace_back(item.key(), item.value());
  DistributedOptimizerOptions other = options;
  other.name_prefix = "other/";
  DistributedOptimizer synchronize_only(named, other);
  EXPECT_THROW(TorchOptimizer{synchronize_only}, ContractError);
}

}  // namespace
}  // namespace kolo
