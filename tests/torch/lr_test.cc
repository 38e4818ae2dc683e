// LR helpers: linear scaling, warmup per step, constant / step / cosine decay
// with exact values, apply_lr on every supported optimizer.
#include "kolo/torch/lr.h"

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo {
namespace {

TEST(Lr, ScaledLrMultipliesByTheWorldSize) {
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 1), 0.1);
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 8), 0.8);
  EXPECT_DOUBLE_EQ(scaled_lr(0.001, 2), 0.002);
  EXPECT_THROW(scaled_lr(0.1, 0), ContractError);
}

TEST(Lr, LinearWarmupPerStepThenConstant) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.peak_lr = 0.4;  // scaled_lr(0.1, 4)
  o.warmup_epochs = 2;
  o.steps_per_epoch = 4;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr(0, 0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(0, 1), 0.1 + 0.3 * (0.25 / 2));  // epoch 0.25 of 2
  EXPECT_DOUBLE_EQ(s.lr(0, 2), 0.1 + 0.3 * 0.25);        // epoch 0.5
  EXPECT_DOUBLE_EQ(s.lr(1, 0), 0.25);                    // half way
  EXPECT_DOUBLE_EQ(s.lr(1, 3), 0.1 + 0.3 * (1.75 / 2));
  EXPECT_DOUBLE_EQ(s.lr(2, 0), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(50, 3), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(1.5), 0.1 + 0.3 * 0.75);
}

TEST(Lr, NoWarmupStartsAtThePeak) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.peak_lr = 0.2;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr(0, 0), 0.2);
}

TEST(Lr, StepDecayCountsFromEpochZero) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.peak_lr = 0.8;
  o.warmup_epochs = 5;
  o.steps_per_epoch = 10;
  o.decay = LrDecay::kStep;
  o.step_epochs = 30;
  o.step_factor = 0.1;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr(2.5), 0.1 + 0.7 * 0.5);  // warmup
  EXPECT_DOUBLE_EQ(s.lr(5, 0), 0.8);
  EXPECT_DOUBLE_EQ(s.lr(29, 9), 0.8);
  EXPECT_DOUBLE_EQ(s.lr(30, 0), 0.8 * 0.1);
  EXPECT_DOUBLE_EQ(s.lr(59, 9), 0.8 * 0.1);
  EXPECT_DOUBLE_EQ(s.lr(60, 0), 0.8 * 0.1 * 0.1);
}

TEST(Lr, CosineDecayFromWarmupEndToTheFloor) {
  LrScheduleOptions o;
  o.base_lr = 0.01;
  o.peak_lr = 0.02;
  o.warmup_epochs = 2;
  o.steps_per_epoch = 5;
  o.decay = LrDecay::kCosine;
  o.total_epochs = 12;
  o.min_lr = 0.001;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr(1, 0), 0.015);
  EXPECT_DOUBLE_EQ(s.lr(2, 0), 0.02);
  EXPECT_DOUBLE_EQ(s.lr(7, 0), 0.001 + 0.019 * 0.5);  // half way: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.lr(4.5), 0.001 + 0.019 * 0.5 * (1 + std::cos(M_PI * 0.25)));
  EXPECT_DOUBLE_EQ(s.lr(12, 0), 0.001);
  EXPECT_DOUBLE_EQ(s.lr(20, 0), 0.001);
}

TEST(Lr, RejectsBadSchedules) {
  LrScheduleOptions o;
  o.steps_per_epoch = 0;
  EXPECT_THROW(LrSchedule{o}, ContractError);
  o.steps_per_epoch = 1;
  o.warmup_epochs = -1;
  EXPECT_THROW(LrSchedule{o}, ContractError);
  o.warmup_epochs = 5;
  o.decay = LrDecay::kCosine;
  o.total_epochs = 5;
  EXPECT_THROW(LrSchedule{o}, ContractError);
  o.decay = LrDecay::kStep;
  o.step_epochs = 0;
  EXPECT_THROW(LrSchedule{o}, ContractError);
}

std::vector<torch::Tensor> params() {
  return {torch::zeros({2}, torch::requires_grad()), torch::zeros({3}, torch::requires_grad())};
}

TEST(Lr, ApplyLrSetsEveryParamGroupOfEveryKnownOptimizer) {
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  optimizers.push_back(
      std::make_unique<torch::optim::SGD>(params(), torch::optim::SGDOptions(0.1)));
  optimizers.push_back(std::make_unique<torch::optim::Adam>(params()));
  optimizers.push_back(std::make_unique<torch::optim::AdamW>(params()));
  optimizers.push_back(std::make_unique<torch::optim::RMSprop>(params()));
  optimizers.push_back(std::make_unique<torch::optim::Adagrad>(params()));
  for (auto& optimizer : optimizers) {
    // A second group with its own lr.
    optimizer->add_param_group(torch::optim::OptimizerParamGroup(
        {torch::zeros({1}, torch::requires_grad())}, optimizer->defaults().clone()));
    apply_lr(*optimizer, 0.0125);
    ASSERT_EQ(optimizer->param_groups().size(), 2u);
    EXPECT_EQ(current_lr(*optimizer, 0), 0.0125);
    EXPECT_EQ(current_lr(*optimizer, 1), 0.0125);
  }
  EXPECT_THROW(current_lr(*optimizers[0], 2), ContractError);
}

// An optimizer kolo does not know, whose options do not expose the lr.
struct OpaqueOptions : torch::optim::OptimizerCloneableOptions<OpaqueOptions> {};
struct Opaque : torch::optim::Optimizer {
  explicit Opaque(std::vector<torch::Tensor> p)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(p))},
                  std::make_unique<OpaqueOptions>()) {}
  torch::Tensor step(LossClosure) override { return {}; }
};

TEST(Lr, UnknownOptimizerIsAContractError) {
  Opaque optimizer(params());
  try {
    apply_lr(optimizer, 0.1);
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("SGD, Adam, AdamW, RMSprop, Adagrad"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kolo
