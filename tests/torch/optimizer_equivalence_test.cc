// DistributedOptimizer equivalence: n ranks with batch B each train exactly
// as one process with batch n * B (the gradient of the mean loss over n * B
// rows is the average of the ranks' gradients), for SGD with momentum and
// Adam, with fp16 / bf16 compression, op = sum, a predivide factor, local
// accumulation over k backward passes, and at world size 1; and the same
// with gradients as bucket views (bitwise equal to the default exchange).
//
// Tolerances (float32, element-wise |a - e| <= atol + rtol * |e|):
//   exact reduction:   rtol 1e-5, atol 1e-6 (summation order differs)
//   fp16 compression:  rtol 2e-3, atol 2e-4 (10 mantissa bits)
//   bf16 compression:  rtol 2e-2, atol 2e-3 (7 mantissa bits)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;

using ot::Batch;
using ot::clone_of;
using ot::EngineWorld;
using ot::Mlp;
using ot::OptimizerKind;

constexpr int kSteps = 5;
constexpr int64_t kBatch = 6;  // rows per rank per backward pass
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

struct TrainingRun {
  int world = 2;
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.05;
  DistributedOptimizerOptions options;
};

// The reference: one process, plain optimizer, every rank's rows of each
// step in one batch (all k passes' rows too). With op = sum the ranks' mean
// losses are summed instead of averaged.
std::shared_ptr<Mlp> train_single(const Mlp& initial, const std::vector<Batch>& batches,
                                  const TrainingRun& run) {
  auto model = clone_of(initial);
  auto optimizer = ot::make_optimizer(run.kind, model->parameters(), run.lr);
  for (const Batch& batch : batches) {
    optimizer->zero_grad();
    torch::Tensor loss = ot::loss_of(*model, batch.x, batch.y);
    if (run.options.op == ReduceOp::kSum) loss = loss * run.world;
    loss.backward();
    optimizer->step();
  }
  return model;
}

// `run.world` ranks as threads: rank r's rows of pass p of a step are block
// (p * world + r) of the step's batch, B rows each.
std::vector<std::shared_ptr<Mlp>> train_distributed(const Mlp& initial,
                                                    const std::vector<Batch>& batches,
                                                    const TrainingRun& run) {
  const int k = run.options.backward_passes_per_step;
  EngineWorld world("threads", run.world);
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < run.world; ++r) models.push_back(clone_of(initial));
  ot::run_ranks(run.world, [&](int rank) {
    auto engine = world.engine(rank);
    Mlp& model = *models[rank];
    auto optimizer = ot::make_optimizer(run.kind, model.parameters(), run.lr);
    DistributedOptimizerOptions options = run.options;
    options.engine = engine.get();
    options.timeout = ot::kEngineTimeout;
    DistributedOptimizer distributed(*optimizer, model.named_parameters(), options);
    for (const Batch& batch : batches) {
      distributed.zero_grad();
      for (int pass = 0; pass < k; ++pass) {
        const int64_t block = pass * run.world + rank;
        torch::Tensor x = batch.x.slice(0, block * kBatch, (block + 1) * kBatch);
        torch::Tensor y = batch.y.slice(0, block * kBatch, (block + 1) * kBatch);
        ot::loss_of(model, x, y).backward();
      }
      distributed.step();
    }
    const auto stats = distributed.stats();
    EXPECT_EQ(stats.steps, batches.size());
    // Every gradient's allreduce started inside backward(), none was missing.
    EXPECT_EQ(stats.hook_submissions, batches.size() * model.parameters().size());
    EXPECT_EQ(stats.step_submissions, 0u);
    ot::finish(*engine);
  });
  return models;
}

// `lossy`: compression must leave a visible rounding difference (so the test
// cannot pass with compression silently off).
void expect_equivalent(const TrainingRun& run, double rtol, double atol, bool lossy = false) {
  torch::manual_seed(7);
  Mlp initial;
  const int k = run.options.backward_passes_per_step;
  const auto batches = ot::make_batches(kSteps, run.world * k * kBatch);
  auto expected = train_single(initial, batches, run);
  auto actual = train_distributed(initial, batches, run);
  for (int r = 0; r < run.world; ++r) {
    ot::expect_params_close(*actual[r], *expected, rtol, atol, "rank " + std::to_string(r));
  }
  if (lossy) {
    EXPECT_GT((actual[0]->fc1->weight - expected->fc1->weight).abs().max().item<double>(), 0.0);
  }
  // The run moved the parameters (the comparison is not vacuous).
  EXPECT_GT((expected->fc1->weight - initial.fc1->weight).abs().max().item<double>(), 1e-3);
}

class OptimizerEquivalence : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(OptimizerEquivalence, SgdTwoRanksMatchOneProcessWithTheWholeBatch) {
  TrainingRun run;
  run.kind = OptimizerKind::kSgd;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, AdamTwoRanksMatchOneProcessWithTheWholeBatch) {
  TrainingRun run;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, AdamThreeRanks) {
  TrainingRun run;
  run.world = 3;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, WorldOfOneMatchesThePlainOptimizer) {
  TrainingRun run;
  run.world = 1;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, SumOfRanksMatchesTheSumOfTheirLosses) {
  TrainingRun run;
  run.options.op = ReduceOp::kSum;
  expect_equivalent(run, kRtol, kAtol);
}

// SGD below where a wrong scale must show: Adam is nearly invariant to the
// gradients' scale.
TEST_F(OptimizerEquivalence, PredivideFactorDoesNotChangeTheAverage) {
  TrainingRun run;
  run.options.gradient_predivide_factor = 4.0;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, Fp16CompressionWithinHalfPrecision) {
  TrainingRun run;
  run.options.compression = Compression::kFp16;
  expect_equivalent(run, 2e-3, 2e-4, /*lossy=*/true);
}

TEST_F(OptimizerEquivalence, Bf16CompressionWithinBfloat16Precision) {
  TrainingRun run;
  run.options.compression = Compression::kBf16;
  expect_equivalent(run, 2e-2, 2e-3, /*lossy=*/true);
}

TEST_F(OptimizerEquivalence, BackwardPassesPerStepMatchTheAccumulatedBatch) {
  TrainingRun run;
  run.options.backward_passes_per_step = 3;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BackwardPassesPerStepWithAdam) {
  TrainingRun run;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  run.options.backward_passes_per_step = 2;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BackwardPassesPerStepAtWorldSizeOne) {
  TrainingRun run;
  run.world = 1;
  run.options.backward_passes_per_step = 2;
  expect_equivalent(run, kRtol, kAtol);
}

// Gradients as bucket views (gradient_as_bucket_view): the same
// equivalences, each bucket one in-place allreduce of its buffer.
TEST_F(OptimizerEquivalence, BucketViewsSgdTwoRanks) {
  TrainingRun run;
  run.options.gradient_as_bucket_view = true;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BucketViewsAdamThreeRanksGradientByGradient) {
  TrainingRun run;
  run.world = 3;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  run.options.gradient_as_bucket_view = true;
  run.options.bucket_bytes = 0;  // a bucket (and a buffer) per gradient
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BucketViewsAdamTwoRanks) {
  TrainingRun run;
  run.kind = OptimizerKind::kAdam;
  run.lr = 1e-2;
  run.options.gradient_as_bucket_view = true;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BucketViewsBackwardPassesPerStepAccumulateInTheBuffer) {
  TrainingRun run;
  run.options.backward_passes_per_step = 3;
  run.options.gradient_as_bucket_view = true;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BucketViewsSumAndPredivide) {
  TrainingRun run;
  run.options.op = ReduceOp::kSum;
  run.options.gradient_as_bucket_view = true;
  expect_equivalent(run, kRtol, kAtol);
  run.options.op = ReduceOp::kAverage;
  run.options.gradient_predivide_factor = 4.0;
  expect_equivalent(run, kRtol, kAtol);
}

TEST_F(OptimizerEquivalence, BucketViewsFp16CompressionHookGetsTheBuffer) {
  TrainingRun run;
  run.options.compression = Compression::kFp16;
  run.options.gradient_as_bucket_view = true;
  expect_equivalent(run, 2e-3, 2e-4, /*lossy=*/true);
}

// With and without bucket views the ranks compute the same sums of the same
// numbers: the trained parameters are bitwise equal.
TEST_F(OptimizerEquivalence, BucketViewsBitwiseEqualToRequestsPerGradient) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    torch::manual_seed(7);
    Mlp initial;
    TrainingRun run;
    run.kind = kind;
    run.lr = kind == OptimizerKind::kAdam ? 1e-2 : 0.05;
    const auto batches = ot::make_batches(kSteps, run.world * kBatch);
    auto plain = train_distributed(initial, batches, run);
    run.options.gradient_as_bucket_view = true;
    auto viewed = train_distributed(initial, batches, run);
    for (int r = 0; r < run.world; ++r) {
      auto a = viewed[r]->named_parameters();
      auto e = plain[r]->named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i].value(), e[i].value()))
            << "rank " << r << " " << a[i].key()
            << (kind == OptimizerKind::kAdam ? " (Adam)" : " (SGD)");
      }
    }
  }
}

// Uneven per-rank batches (what kolo::BatchBalancer hands out): rank r takes
// rows [offset_r, offset_r + b_r) of each step's batch and scales its mean
// loss by size * b_r / G (BatchBalancer::gradient_weight()), which turns the
// average of the ranks' gradients into the mean over all G rows, as one
// process with the whole batch.
void expect_uneven_batches_equivalent(OptimizerKind kind, double lr,
                                      const std::vector<int64_t>& rows) {
  const int n = static_cast<int>(rows.size());
  int64_t global = 0;
  for (int64_t b : rows) global += b;
  torch::manual_seed(7);
  Mlp initial;
  const auto batches = ot::make_batches(kSteps, global);
  TrainingRun single;
  single.world = n;
  single.kind = kind;
  single.lr = lr;
  auto expected = train_single(initial, batches, single);

  EngineWorld world("threads", n);
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < n; ++r) models.push_back(clone_of(initial));
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Mlp& model = *models[rank];
    auto optimizer = ot::make_optimizer(kind, model.parameters(), lr);
    DistributedOptimizerOptions options;
    options.engine = engine.get();
    options.timeout = ot::kEngineTimeout;
    DistributedOptimizer distributed(*optimizer, model.named_parameters(), options);
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += rows[r];
    const double weight = static_cast<double>(n * rows[rank]) / static_cast<double>(global);
    for (const Batch& batch : batches) {
      distributed.zero_grad();
      const torch::Tensor loss = ot::loss_of(model, batch.x.slice(0, offset, offset + rows[rank]),
                                             batch.y.slice(0, offset, offset + rows[rank]));
      (loss * weight).backward();
      distributed.step();
    }
    ot::finish(*engine);
  });
  for (int r = 0; r < n; ++r) {
    ot::expect_params_close(*models[r], *expected, kRtol, kAtol, "rank " + std::to_string(r));
  }
  EXPECT_GT((expected->fc1->weight - initial.fc1->weight).abs().max().item<double>(), 1e-3);
}

TEST_F(OptimizerEquivalence, UnevenBatchesWeightedBySampleCountMatchOneProcessSgd) {
  expect_uneven_batches_equivalent(OptimizerKind::kSgd, 0.05, {4, 8});
}

TEST_F(OptimizerEquivalence, UnevenBatchesWeightedBySampleCountMatchOneProcessAdam) {
  expect_uneven_batches_equivalent(OptimizerKind::kAdam, 1e-2, {3, 7, 2});
}

}  // namespace
}  // namespace kolo
