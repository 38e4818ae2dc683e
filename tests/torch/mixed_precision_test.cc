// Mixed precision (kolo/torch/mixed_precision.h):
//  - AutocastGuard runs linear layers in bf16 inside and restores the state;
//  - LossScaler over every zero_stage of the factory: an inf injected into
//    one rank's loss skips that step on every rank (the same steps skipped
//    everywhere), halves the scale, and the run equals an unscaled run
//    without that step (power-of-two scales are exact);
//  - the scale grows after growth_interval clean steps;
//  - the scale survives a checkpoint (extras through the one checkpoint
//    call), and malformed extras or options are clear errors.
#include "kolo/torch/mixed_precision.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/optimizer_factory.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
namespace ot = optimizer_testing;
using testing::run_with_engines;

constexpr int kWorld = 2;
constexpr int64_t kRows = 4;  // per rank and step

ParallelOptimizerOptions factory_options(int stage, Engine& engine) {
  ParallelOptimizerOptions o;
  o.zero_stage = stage;
  o.engine = &engine;
  o.timeout = testing::kTorchTimeout;
  return o;
}

LossScalerOptions scaler_options(Engine& engine) {
  LossScalerOptions o;
  o.engine = &engine;
  o.timeout = testing::kTorchTimeout;
  o.growth_interval = 2;
  return o;
}

// Trains a copy of `initial` on every rank with Adam. With a scaler, rank
// `inf_rank` multiplies its loss by inf at step `inf_step`; `stepped` gets
// every rank's LossScaler::step results. Returns rank 0's model.
std::shared_ptr<zt::ZeroNet> train(const zt::ZeroNet& initial,
                                   const std::vector<zt::Batch>& batches, int stage, bool scaled,
                                   int inf_rank, int inf_step,
                                   std::vector<std::vector<bool>>* stepped,
                                   std::vector<double>* scales) {
  std::vector<std::shared_ptr<zt::ZeroNet>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(zt::copy_of(initial));
  if (stepped) stepped->assign(kWorld, {});
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    zt::ZeroNet& model = *models[rank];
    auto inner = zt::make_optimizer(zt::Kind::kAdam, model.parameters());
    auto optimizer = make_parallel_optimizer(*inner, model, factory_options(stage, engine));
    LossScaler scaler(scaler_options(engine));
    for (size_t s = 0; s < batches.size(); ++s) {
      optimizer->zero_grad();
      torch::Tensor loss = zt::loss_of(model, batches[s].share(rank, kWorld));
      if (!scaled) {
        loss.backward();
        optimizer->step();
        continue;
      }
      if (rank == inf_rank && static_cast<int>(s) == inf_step) {
        loss = loss * std::numeric_limits<float>::infinity();
      }
      scaler.scale(loss).backward();
      const bool did = scaler.step(*optimizer);
      (*stepped)[rank].push_back(did);
      if (rank == 0 && scales) scales->push_back(scaler.scale_value());
    }
    if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
    ot::finish(engine);
  });
  for (int r = 1; r < kWorld; ++r) {
    ot::expect_params_close(*models[r], *models[0], 0, 0, "rank " + std::to_string(r));
  }
  return models[0];
}

TEST(MixedPrecision, AutocastRunsLinearLayersInBf16InsideTheGuardOnly) {
  torch::nn::Linear linear(8, 4);
  const torch::Tensor x = torch::randn({2, 8});
  {
    AutocastGuard guard(torch::kBFloat16);
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard off(torch::kBFloat16, false);  // nests: a region in float32
      EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
    }
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    // The backward pass gives float32 parameters float32 gradients.
    linear(x).sum().backward();
  }
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  const std::string error = testing::error_of([] { AutocastGuard guard(torch::kHalf); });
  EXPECT_NE(error.find("autocasts the CPU to BFloat16 only"), std::string::npos) << error;
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16);
  EXPECT_NE(testing::error_of([] { parse_precision("fp8"); }).find("use fp32, bf16 or fp16"),
            std::string::npos);
}

TEST(MixedPrecision, AnInfOnOneRankSkipsTheStepOnEveryRankAtEveryStage) {
  torch::set_num_threads(1);
  torch::manual_seed(31);
  zt::ZeroNet initial;
  constexpr int kSteps = 4;
  constexpr int kInfStep = 1;
  const auto batches = zt::make_batches(kSteps, kWorld * kRows);
  // The unscaled run without the skipped step's batch.
  std::vector<zt::Batch> kept = batches;
  kept.erase(kept.begin() + kInfStep);
  for (int stage : {0, 1, 2, 3}) {
    const std::string what = "zero_stage " + std::to_string(stage);
    const auto expected = train(initial, kept, stage, false, -1, -1, nullptr, nullptr);
    for (int inf_rank : {0, 1}) {
      std::vector<std::vector<bool>> stepped;
      std::vector<double> scales;
      const auto actual =
          train(initial, batches, stage, true, inf_rank, kInfStep, &stepped, &scales);
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(stepped[r], (std::vector<bool>{true, false, true, true}))
            << what << ", inf on rank " << inf_rank << ", rank " << r;
      }
      // 2^16, halved by the overflow, then two clean steps (growth_interval 2) double it.
      EXPECT_EQ(scales, (std::vector<double>{65536, 32768, 32768, 65536})) << what;
      // Scaling by powers of two is exact: the same parameters as unscaled
      // training on the steps that were not skipped.
      ot::expect_params_close(*actual, *expected, 1e-6, 1e-7,
                              what + ", inf on rank " + std::to_string(inf_rank));
    }
  }
}

TEST(MixedPrecision, TheScaleGrowsAfterCleanStepsAndSurvivesACheckpoint) {
  torch::set_num_threads(1);
  torch::manual_seed(32);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(3, kWorld * kRows);
  testing::TempDir dir("kolo-mixed-precision");
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    auto model = zt::copy_of(initial);
    auto inner = zt::make_optimizer(zt::Kind::kSgd, model->parameters());
    auto optimizer = make_parallel_optimizer(*inner, *model, factory_options(2, engine));
    LossScalerOptions options = scaler_options(engine);
    options.init_scale = 1024;
    LossScaler scaler(options);
    for (const zt::Batch& batch : batches) {
      optimizer->zero_grad();
      scaler.scale(zt::loss_of(*model, batch.share(rank, kWorld))).backward();
      EXPECT_FALSE(scaler.unscale(*optimizer));  // unscale first, as to clip the gradients
      EXPECT_FALSE(scaler.unscale(*optimizer));  // a second call divides nothing again
      EXPECT_TRUE(scaler.step(*optimizer));
    }
    EXPECT_EQ(scaler.scale_value(), 2048);
    EXPECT_EQ(scaler.growth_tracker(), 1);
    CheckpointState state;
    state.epoch = 3;
    state.extras = scaler.extras();
    save_checkpoint(dir.path() + "/ckpt", *optimizer, state);

    LossScaler resumed(options);
    EXPECT_EQ(resumed.scale_value(), 1024);
    resumed.restore(load_checkpoint(dir.path() + "/ckpt", *optimizer).extras);
    EXPECT_EQ(resumed.scale_value(), 2048);
    EXPECT_EQ(resumed.growth_tracker(), 1);
    resumed.restore({});  // a checkpoint without a scale changes nothing
    EXPECT_EQ(resumed.scale_value(), 2048);
    ot::finish(engine);
  });
  LossScaler scaler;
  const std::string error = testing::error_of([&] {
    scaler.restore({{"kolo.loss_scale", "lots"}});
  });
  EXPECT_NE(error.find("extras[\"kolo.loss_scale\"] is \"lots\""), std::string::npos) << error;
  LossScalerOptions bad;
  bad.backoff_factor = 2;
  EXPECT_NE(testing::error_of([&] { LossScaler s(bad); }).find("options.backoff_factor is 2"),
            std::string::npos);
  LossScalerOptions off;
  off.enabled = false;
  LossScaler disabled(off);
  EXPECT_EQ(disabled.scale_value(), 1);
  const torch::Tensor loss = torch::ones({});
  EXPECT_TRUE(disabled.scale(loss).is_same(loss));
}

}  // namespace
}  // namespace kolo
