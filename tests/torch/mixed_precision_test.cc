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

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/checkpoint.h"
#include "kolo/torch/compat.h"
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
using zt::factory_options;

constexpr int kWorld = 2;
constexpr int64_t kRows = 4;  // per rank and step

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

// The sum over every parameter element of |a - b|.
double change(zt::ZeroNet& a, zt::ZeroNet& b) {
  double total = 0;
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    total += (a.parameters()[i].to(torch::kFloat) - b.parameters()[i].to(torch::kFloat))
                 .abs()
                 .sum()
                 .item<double>();
  }
  return total;
}

// A bf16 copy of `source` (made on the main thread).
std::shared_ptr<zt::ZeroNet> bf16_copy_of(const zt::ZeroNet& source) {
  auto copy = zt::copy_of(source);
  copy->to(torch::kBFloat16);
  return copy;
}

// The master-weight loop by hand, in one process: bf16 forward and backward,
// float32 copies stepped by plain SGD (lr), rounded back into the model.
std::shared_ptr<zt::ZeroNet> by_hand(const zt::ZeroNet& initial,
                                     const std::vector<zt::Batch>& batches, double lr) {
  auto model = bf16_copy_of(initial);
  std::vector<torch::Tensor> masters;
  for (const auto& p : model->parameters()) masters.push_back(p.detach().to(torch::kFloat));
  for (const zt::Batch& batch : batches) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    zt::loss_of(*model, {batch.x.to(torch::kBFloat16), batch.y}).backward();
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      masters[i] -= lr * params[i].grad().to(torch::kFloat);
      params[i].copy_(masters[i]);
    }
  }
  return model;
}

// Steps too small for bf16 (below half its unit at the parameters' values)
// vanish in a bf16 model stepped directly, and accumulate in float32 master
// weights: at every stage the MasterWeightOptimizer run equals the loop by
// hand (both ranks see the same batch, so the average is exact), and its
// checkpoint holds the master weights: a resumed run continues identically.
TEST(MixedPrecision, Fp32MasterWeightsKeepUpdatesBf16WouldRoundAwayAtEveryStage) {
  torch::set_num_threads(1);
  torch::manual_seed(33);
  // Every parameter's magnitude in [0.5, 1), where bf16's unit is 2^-8, and
  // inputs in [-1, 1]: every gradient element is below 8 in magnitude, so
  // each step (lr 2e-4) changes a parameter by less than half a unit, which
  // a bf16 parameter rounds away, while 30 of them add up to several units.
  zt::ZeroNet initial;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : initial.parameters()) {
      p.copy_((torch::rand_like(p) * 0.45 + 0.5) * (torch::randint(0, 2, p.sizes()) * 2 - 1));
    }
  }
  constexpr double kLr = 2e-4;
  auto batches = zt::make_batches(30, kRows);
  for (auto& batch : batches) batch.x = batch.x.clamp(-1, 1);
  const auto expected = by_hand(initial, batches, kLr);
  const auto start = bf16_copy_of(initial);
  // The updates are real: the model moved, although every single step was
  // too small to change a bf16 value on its own.
  ASSERT_GT(change(*expected, *start), 0);
  for (int stage : {0, 1, 2, 3}) {
    const std::string what = "zero_stage " + std::to_string(stage);
    testing::TempDir dir("kolo-master-weights");
    std::vector<std::shared_ptr<zt::ZeroNet>> models, plain, resumed;
    for (int r = 0; r < kWorld; ++r) {
      models.push_back(bf16_copy_of(initial));
      plain.push_back(bf16_copy_of(initial));
      resumed.push_back(bf16_copy_of(initial));
    }
    int64_t state_bytes = 0;
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      // Runs `steps` of `batches` from `first` on `model` with `optimizer`.
      const auto run = [&](zt::ZeroNet& model, ParallelOptimizer& optimizer, size_t first,
                           size_t last) {
        for (size_t s = first; s < last; ++s) {
          optimizer.zero_grad();
          zt::loss_of(model, {batches[s].x.to(torch::kBFloat16), batches[s].y}).backward();
          optimizer.step();
        }
      };
      {
        torch::optim::SGD sgd(models[rank]->parameters(), torch::optim::SGDOptions(kLr));
        MasterWeightOptimizer master(sgd);
        auto optimizer =
            make_parallel_optimizer(master, *models[rank], factory_options(stage, engine));
        run(*models[rank], *optimizer, 0, 15);
        save_checkpoint(dir.path() + "/ckpt", *optimizer, {});
        run(*models[rank], *optimizer, 15, batches.size());
        if (rank == 0) state_bytes = optimizer_state_bytes(master);
        if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      }
      {
        torch::optim::SGD sgd(resumed[rank]->parameters(), torch::optim::SGDOptions(kLr));
        MasterWeightOptimizer master(sgd);
        auto optimizer =
            make_parallel_optimizer(master, *resumed[rank], factory_options(stage, engine));
        load_checkpoint(dir.path() + "/ckpt", *optimizer);
        run(*resumed[rank], *optimizer, 15, batches.size());
        if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      }
      {
        torch::optim::SGD sgd(plain[rank]->parameters(), torch::optim::SGDOptions(kLr));
        auto optimizer = make_parallel_optimizer(sgd, *plain[rank], factory_options(stage, engine));
        run(*plain[rank], *optimizer, 0, batches.size());
        if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      }
      ot::finish(engine);
    });
    for (int r = 0; r < kWorld; ++r) {
      const std::string who = what + ", rank " + std::to_string(r);
      ot::expect_params_close(*models[r], *expected, 0, 0, who + " with master weights");
      ot::expect_params_close(*resumed[r], *expected, 0, 0, who + " resumed from the checkpoint");
      // Without them, no parameter moved at all.
      ot::expect_params_close(*plain[r], *start, 0, 0, who + " without master weights");
    }
    // The float32 master copies: 4 bytes per element on rank 0 (stage 0: all
    // of them; ZeRO: its slices, about half).
    int64_t elements = 0;
    for (const auto& p : start->parameters()) elements += p.numel();
    if (stage == 0) {
      EXPECT_EQ(state_bytes, 4 * elements) << what;
    } else {
      EXPECT_LE(state_bytes, 4 * (elements / kWorld + 4)) << what;
    }
  }
}

// The single-file checkpoint encoding (kolo::save_checkpoint(path, ...),
// elastic commits) holds the master weights and the inner state too.
TEST(MixedPrecision, MasterWeightsSurviveTheSingleFileEncoding) {
  torch::set_num_threads(1);
  torch::manual_seed(34);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(4, kRows);
  const auto step = [](zt::ZeroNet& model, torch::optim::Optimizer& optimizer,
                       const zt::Batch& batch) {
    optimizer.zero_grad();
    zt::loss_of(model, {batch.x.to(torch::kBFloat16), batch.y}).backward();
    optimizer.step();
  };
  auto model = bf16_copy_of(initial);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  MasterWeightOptimizer master(adam);
  EXPECT_THROW(MasterWeightOptimizer(adam).step([] { return torch::Tensor(); }), ContractError);
  for (int s = 0; s < 3; ++s) step(*model, master, batches[s]);
  const std::string payload = encode_checkpoint(*model, &master, {});

  auto copy = bf16_copy_of(initial);
  torch::optim::Adam adam_copy(copy->parameters(), torch::optim::AdamOptions(1e-3));
  MasterWeightOptimizer master_copy(adam_copy);
  decode_checkpoint(payload, *copy, &master_copy, "test");
  step(*model, master, batches[3]);
  step(*copy, master_copy, batches[3]);
  ot::expect_params_close(*copy, *model, 0, 0, "resumed");
  for (const auto& p : copy->parameters()) {
    const auto& s = static_cast<const MasterParamState&>(
        *master_copy.state().at(kolo::compat::optimizer_state_key(p)));
    EXPECT_EQ(s.master.scalar_type(), torch::kFloat);
    EXPECT_TRUE(s.inner != nullptr);
  }
  // A stepped optimizer cannot be wrapped: its state belongs to the bf16 parameters.
  torch::optim::Adam stepped(copy->parameters(), torch::optim::AdamOptions(1e-3));
  stepped.step();
  const std::string error = testing::error_of([&] { MasterWeightOptimizer again(stepped); });
  EXPECT_NE(error.find("wrap it before its first step"), std::string::npos) << error;
}

}  // namespace
}  // namespace kolo
