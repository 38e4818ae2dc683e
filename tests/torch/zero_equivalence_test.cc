// ZeroOptimizer equivalence: stages 1, 2 and 3 end with the same parameters
// as DistributedOptimizer after several steps of SGD (momentum, weight decay)
// and Adam (weight decay), at world sizes 1, 2, 3 and 4, on a model of 174
// elements (slices of unequal size; parameters straddle slice boundaries;
// stages 1 and 2 also with small buckets that cut the model in three).
// Each rank trains both models on the same engine, side by side.
//
// Tolerance (float32, element-wise |zero - ddp| <= atol + rtol * |ddp|):
// rtol 1e-5, atol 1e-6: reduce-scatter and allreduce sum in different orders.
//
// Also: the memory accounting reports 1/N of the optimizer state (stage 1),
// of the gradients (stage 2) and of the parameters (stage 3) exactly as the
// slices are sized; invalid use is an error on every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kolo/torch/optimizer.h"
#include "kolo/torch/zero.h"
#include "optimizer_harness.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
using testing::run_with_engines;

constexpr int kSteps = 4;
constexpr int64_t kRowsPerRank = 3;
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

struct Case {
  int world = 2;
  int stage = 1;
  zt::Kind kind = zt::Kind::kSgd;
  int64_t bucket_bytes = 32 << 20;
};

std::string describe(const Case& c) {
  return "stage " + std::to_string(c.stage) + " world " + std::to_string(c.world) +
         (c.kind == zt::Kind::kSgd ? " SGD" : " Adam") + " buckets of " +
         std::to_string(c.bucket_bytes) + " B";
}

void expect_equivalent(const Case& c) {
  torch::manual_seed(11);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(kSteps, c.world * kRowsPerRank);
  std::vector<std::shared_ptr<zt::ZeroNet>> ddp_models, zero_models;
  for (int r = 0; r < c.world; ++r) {
    ddp_models.push_back(zt::copy_of(initial));
    zero_models.push_back(zt::copy_of(initial));
  }
  run_with_engines(c.world, [&](int rank, Engine& engine) {
    zt::ZeroNet& ddp_model = *ddp_models[rank];
    zt::ZeroNet& zero_model = *zero_models[rank];
    auto ddp_inner = zt::make_optimizer(c.kind, ddp_model.parameters());
    auto zero_inner = zt::make_optimizer(c.kind, zero_model.parameters());
    DistributedOptimizerOptions ddp_options;
    ddp_options.engine = &engine;
    ddp_options.timeout = testing::kTorchTimeout;
    DistributedOptimizer ddp(*ddp_inner, ddp_model.named_parameters(), ddp_options);
    ZeroOptions zero_options;
    zero_options.stage = c.stage;
    zero_options.bucket_bytes = c.bucket_bytes;
    zero_options.engine = &engine;
    zero_options.timeout = testing::kTorchTimeout;
    ZeroOptimizer zero(*zero_inner, zero_model, zero_options);
    for (const zt::Batch& batch : batches) {
      const zt::Batch mine = batch.share(rank, c.world);
      ddp.zero_grad();
      zt::loss_of(ddp_model, mine).backward();
      ddp.step();
      zero.zero_grad();
      zt::loss_of(zero_model, mine).backward();
      zero.step();
    }
    zero.gather_parameters();  // stage 3: the full parameters, to compare
    optimizer_testing::expect_params_close(zero_model, ddp_model, kRtol, kAtol,
                                           describe(c) + " rank " + std::to_string(rank));
    // The run moved the parameters (the comparison is not vacuous).
    EXPECT_GT((zero_model.parameters()[0] - initial.parameters()[0]).abs().max().item<double>(),
              1e-3);
    zero.release_parameters();
    optimizer_testing::finish(engine);
  });
}

class ZeroEquivalence : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(ZeroEquivalence, SgdAndAdamMatchDistributedOptimizerAtWorldSizes1To4) {
  const int stage = GetParam();
  for (int world : {1, 2, 3, 4}) {
    for (zt::Kind kind : {zt::Kind::kSgd, zt::Kind::kAdam}) {
      Case c;
      c.world = world;
      c.stage = stage;
      c.kind = kind;
      expect_equivalent(c);
      if (stage < 3 && world >= 3) {
        c.bucket_bytes = 300;  // three buckets: fc1.weight | fc1.bias | fc2.weight + fc2.bias
        expect_equivalent(c);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroEquivalence, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

// Bytes of `elements` float32 values.
int64_t f32(int64_t elements) { return elements * 4; }

TEST(ZeroMemory, EachStageHoldsOneNthOfWhatItShards) {
  torch::set_num_threads(1);
  torch::manual_seed(3);
  constexpr int kWorld = 3;
  constexpr int64_t kNumel = 174;
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(2, kWorld * kRowsPerRank);
  for (int stage : {1, 2, 3}) {
    std::vector<std::shared_ptr<zt::ZeroNet>> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(zt::copy_of(initial));
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      zt::ZeroNet& model = *models[rank];
      auto adam = zt::make_optimizer(zt::Kind::kAdam, model.parameters());
      ZeroOptions options;
      options.stage = stage;
      options.engine = &engine;
      options.timeout = testing::kTorchTimeout;
      ZeroOptimizer zero(*adam, model, options);
      int64_t mine = 0;  // elements of this rank's slices
      int64_t largest_unit = 0;
      for (const auto& b : zero.buckets()) {
        mine += b.shard_numel;
        largest_unit = std::max(largest_unit, b.numel);
      }
      EXPECT_LE(mine, (kNumel + kWorld - 1) / kWorld + (stage == 3 ? 1 : 0));
      for (const zt::Batch& batch : batches) {
        zero.zero_grad();
        zt::loss_of(model, batch.share(rank, kWorld)).backward();
        zero.step();
      }
      const ZeroMemory m = zero.memory();
      const std::string what = "stage " + std::to_string(stage) + " rank " + std::to_string(rank);
      // Adam: exp_avg and exp_avg_sq for this rank's elements only.
      EXPECT_EQ(m.optimizer_state_bytes, 2 * f32(mine)) << what;
      if (stage == 1) {
        // Full parameters and gradients; the slice being stepped and the
        // reduced gradient slice are views of them (no copies).
        EXPECT_EQ(m.param_bytes, f32(kNumel)) << what;
        EXPECT_EQ(m.grad_bytes, f32(kNumel)) << what;
      } else if (stage == 2) {
        EXPECT_EQ(m.param_bytes, f32(kNumel)) << what;
        EXPECT_EQ(m.grad_bytes, f32(mine)) << what;  // the full gradients were released
      } else {
        EXPECT_EQ(m.param_bytes, f32(mine)) << what;
        EXPECT_EQ(m.grad_bytes, f32(mine)) << what;
        // At the peak: the slices plus at most two gathered units (one running,
        // one prefetched).
        EXPECT_LE(m.peak_param_bytes, f32(mine + 2 * largest_unit)) << what;
        EXPECT_GT(m.peak_param_bytes, f32(mine)) << what;
      }
      optimizer_testing::finish(engine);
    });
  }
}

TEST(ZeroErrors, InvalidUseFailsOnEveryRank) {
  torch::set_num_threads(1);
  // A stage that does not exist.
  run_with_engines(2, [&](int, Engine& engine) {
    zt::ZeroNet model;
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    ZeroOptions options;
    options.stage = 4;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    const std::string error = testing::error_of([&] { ZeroOptimizer zero(sgd, model, options); });
    EXPECT_NE(error.find("options.stage is 4"), std::string::npos) << error;
    optimizer_testing::finish(engine);
  });
  // Stage 3 with a parameter outside every ShardedUnit.
  struct Bare : torch::nn::Module {
    Bare() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
    torch::nn::Linear fc{nullptr};
  };
  run_with_engines(2, [&](int, Engine& engine) {
    Bare model;
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    ZeroOptions options;
    options.stage = 3;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    const std::string error = testing::error_of([&] { ZeroOptimizer zero(sgd, model, options); });
    EXPECT_NE(error.find("'fc.weight' is in no kolo::ShardedUnit"), std::string::npos) << error;
    optimizer_testing::finish(engine);
  });
}

}  // namespace
}  // namespace kolo
