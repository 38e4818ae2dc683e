// Communication hooks under DistributedOptimizer (ranks as threads): a custom
// hook sees every bucket once per step, PowerSGD at full rank reduces as
// plain allreduce, PowerSGD's error feedback survives a checkpoint, and the
// hooks a configuration cannot honour are errors.
#include "kolo/torch/comm_hook.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/parallel_optimizer.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;

using ot::Batch;
using ot::clone_of;
using ot::EngineWorld;
using ot::Mlp;
using ::testing::HasSubstr;

constexpr int64_t kRows = 6;  // per rank and step

DistributedOptimizerOptions on_engine(Engine& engine, std::shared_ptr<CommHook> hook) {
  DistributedOptimizerOptions o;
  o.engine = &engine;
  o.timeout = ot::kEngineTimeout;
  o.comm_hook = std::move(hook);
  return o;
}

// Trains one model per rank over `batches` from `from` to `to`, each rank on
// its rows; `hook_for(rank)` gives each rank's hook (nullptr = none).
void train(DistributedOptimizer& optimizer, Mlp& model, const std::vector<Batch>& batches, int rank,
           size_t from, size_t to) {
  for (size_t s = from; s < to; ++s) {
    optimizer.zero_grad();
    ot::loss_of(model, batches[s].rows(rank, kRows, batches[s].x),
                batches[s].rows(rank, kRows, batches[s].y))
        .backward();
    optimizer.step();
  }
}

std::vector<std::shared_ptr<Mlp>> run(const Mlp& initial, const std::vector<Batch>& batches,
                                      int world,
                                      const std::function<std::shared_ptr<CommHook>(int)>& hook_for,
                                      int64_t bucket_bytes = 25 << 20) {
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < world; ++r) models.push_back(clone_of(initial));
  EngineWorld engines("threads", world);
  ot::run_ranks(world, [&](int rank) {
    auto engine = engines.engine(rank);
    Mlp& model = *models[rank];
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DistributedOptimizerOptions o = on_engine(*engine, hook_for(rank));
    o.bucket_bytes = bucket_bytes;
    DistributedOptimizer optimizer(sgd, model, o);
    train(optimizer, model, batches, rank, 0, batches.size());
    ot::finish(*engine);
  });
  return models;
}

class CommHooks : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(CommHooks, ACustomHookSeesEveryBucketOncePerStepAndReducesAsTheDefault) {
  const int world = GetParam();
  constexpr int kSteps = 3;
  torch::manual_seed(3);
  Mlp initial;
  const auto batches = ot::make_batches(kSteps, world * kRows);
  const auto expected = run(initial, batches, world, [](int) { return nullptr; });
  // bucket_bytes 0: every gradient is a bucket of its own (4 buckets); the
  // default: one bucket.
  for (int64_t bucket_bytes : {int64_t{0}, int64_t{25} << 20}) {
    const size_t buckets = bucket_bytes == 0 ? 4 : 1;
    std::mutex mutex;
    // (rank, step, bucket index) -> calls; (rank, step) -> calls marked last.
    std::map<std::tuple<int, int64_t, int>, int> calls;
    std::map<std::pair<int, int64_t>, int> lasts;
    auto hook_for = [&](int rank) {
      return make_comm_hook("counting allreduce", [&, rank](CommBucket& bucket) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          ++calls[{rank, bucket.step, bucket.index}];
          if (bucket.last) ++lasts[{rank, bucket.step}];
        }
        // The buffer holds the bucket's gradients end to end.
        int64_t numel = 0;
        for (const torch::Tensor& g : bucket.gradients()) numel += g.numel();
        EXPECT_EQ(numel, bucket.buffer.numel());
        EXPECT_EQ(bucket.size, world);
        return CommFuture(allreduce_async_(bucket.buffer, bucket.name, bucket.reduce));
      });
    };
    const auto actual = run(initial, batches, world, hook_for, bucket_bytes);
    for (int r = 0; r < world; ++r) {
      ot::expect_params_close(*actual[r], *expected[r], 1e-5, 1e-6, "rank " + std::to_string(r));
      for (int64_t s = 0; s < kSteps; ++s) {
        for (size_t b = 0; b < buckets; ++b) {
          EXPECT_EQ((calls[{r, s, static_cast<int>(b)}]), 1)
              << "rank " << r << " step " << s << " bucket " << b;
        }
        EXPECT_EQ((lasts[{r, s}]), 1) << "rank " << r << " step " << s;
      }
    }
    EXPECT_EQ(calls.size(), world * kSteps * buckets);
  }
}

// With rank r = min(n, m) the approximation P Q^T spans every matrix
// gradient, so PowerSGD reduces exactly (up to rounding) as allreduce does.
TEST_P(CommHooks, PowerSGDAtFullRankEqualsPlainAllreduce) {
  const int world = GetParam();
  torch::manual_seed(5);
  Mlp initial;
  const auto batches = ot::make_batches(5, world * kRows);
  const auto expected = run(initial, batches, world, [](int) { return nullptr; });
  std::vector<std::shared_ptr<PowerSGDHook>> hooks;
  for (int r = 0; r < world; ++r) {
    PowerSGDOptions o;
    o.rank = 16;  // >= min(n, m) of fc1.weight (16 x 8) and fc2.weight (4 x 16)
    o.start_step = 1;
    o.min_compression_rate = 0;  // compress every matrix, though full rank saves nothing
    hooks.push_back(powersgd_hook(o));
  }
  const auto actual = run(initial, batches, world, [&](int r) { return hooks[r]; });
  for (int r = 0; r < world; ++r) {
    ot::expect_params_close(*actual[r], *expected[r], 1e-4, 1e-5, "rank " + std::to_string(r));
    EXPECT_EQ(hooks[r]->stats().steps, 4);  // steps 1-4 ran compressed
  }
}

// At low rank the result differs from allreduce, is the same on every rank,
// and sends fewer numbers.
TEST_P(CommHooks, PowerSGDAtRankOneKeepsTheRanksIdenticalAndSendsLess) {
  const int world = GetParam();
  torch::manual_seed(6);
  Mlp initial;
  const auto batches = ot::make_batches(4, world * kRows);
  std::vector<std::shared_ptr<PowerSGDHook>> hooks;
  for (int r = 0; r < world; ++r) hooks.push_back(powersgd_hook({}));
  const auto actual = run(initial, batches, world, [&](int r) { return hooks[r]; });
  for (int r = 1; r < world; ++r) {
    ot::expect_params_close(*actual[r], *actual[0], 0, 0, "rank " + std::to_string(r));
  }
  const PowerSGDHook::Stats stats = hooks[0]->stats();
  EXPECT_EQ(stats.steps, 3);
  // 16x8 and 4x16 at rank 1 (the 4x16 one saves 3.2x: compressed) plus biases.
  EXPECT_EQ(stats.gradient_elements, 16 * 8 + 16 + 4 * 16 + 4);
  EXPECT_EQ(stats.sent_elements, (16 + 8) + (4 + 16) + 16 + 4);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommHooks, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

// The error feedback (and warm-start Q) is per rank; it goes into the
// checkpoint with the optimizer and comes back on load, so a resumed run ends
// where the uninterrupted one does; a run resumed without it does not.
TEST(CommHookCheckpoint, PowerSGDErrorFeedbackSurvivesACheckpoint) {
  torch::set_num_threads(1);
  constexpr int kWorld = 2;
  torch::manual_seed(8);
  Mlp initial;
  const auto batches = ot::make_batches(6, kWorld * kRows);
  testing::TempDir dir("kolo-powersgd-checkpoint");
  std::vector<std::shared_ptr<Mlp>> straight, resumed, forgetful;
  for (int r = 0; r < kWorld; ++r) {
    straight.push_back(clone_of(initial));
    resumed.push_back(clone_of(initial));
    forgetful.push_back(clone_of(initial));
  }
  PowerSGDOptions psgd;
  psgd.start_step = 1;
  EngineWorld engines("threads", kWorld);
  ot::run_ranks(kWorld, [&](int rank) {
    auto engine = engines.engine(rank);
    {
      Mlp& model = *straight[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto hook = powersgd_hook(psgd);
      DistributedOptimizer optimizer(sgd, model, on_engine(*engine, hook));
      train(optimizer, model, batches, rank, 0, 3);
      CheckpointState state;
      state.step = 3;
      save_checkpoint(dir.path(), optimizer, state);
      EXPECT_FALSE(hook->save_state().empty());
      train(optimizer, model, batches, rank, 3, batches.size());
    }
    for (bool keep_state : {true, false}) {
      Mlp& model = keep_state ? *resumed[rank] : *forgetful[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto hook = powersgd_hook(psgd);
      DistributedOptimizer optimizer(sgd, model, on_engine(*engine, hook));
      const CheckpointState state = load_checkpoint(dir.path(), optimizer);
      EXPECT_EQ(state.step, 3);
      if (!keep_state) hook->load_state("");  // a fresh error feedback and Q
      train(optimizer, model, batches, rank, static_cast<size_t>(state.step), batches.size());
    }
    ot::finish(*engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*resumed[r], *straight[r], 1e-6, 1e-7, "rank " + std::to_string(r));
    const double apart =
        (forgetful[r]->fc1->weight - straight[r]->fc1->weight).abs().max().item<double>();
    EXPECT_GT(apart, 1e-5) << "without its state the resumed run should differ";
  }
}

TEST(CommHookErrors, ZeroStagesCompressionAndDifferentHooksAreContractErrors) {
  torch::set_num_threads(1);
  constexpr int kWorld = 2;
  torch::manual_seed(9);
  Mlp initial;
  std::vector<std::shared_ptr<Mlp>> models = {clone_of(initial), clone_of(initial)};
  EngineWorld engines("threads", kWorld);
  ot::run_ranks(kWorld, [&](int rank) {
    auto engine = engines.engine(rank);
    Mlp& model = *models[rank];
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    for (int stage : {1, 2, 3}) {
      ParallelOptimizerOptions o;
      static_cast<DistributedOptimizerOptions&>(o) = on_engine(*engine, powersgd_hook({}));
      o.zero_stage = stage;
      try {
        make_parallel_optimizer(sgd, model, o);
        ADD_FAILURE() << "stage " << stage << " took a hook";
      } catch (const ContractError& e) {
        EXPECT_THAT(e.what(), HasSubstr("options.comm_hook is 'powersgd rank=1"));
        EXPECT_THAT(e.what(), HasSubstr("use zero_stage 0 for hooks"));
      }
    }
    // Compression is a hook itself: not both (every rank throws).
    DistributedOptimizerOptions both = on_engine(*engine, allreduce_hook());
    both.compression = Compression::kFp16;
    try {
      DistributedOptimizer optimizer(sgd, model, both);
      ADD_FAILURE() << "compression and a hook were both taken";
    } catch (const ContractError& e) {
      EXPECT_THAT(e.what(), HasSubstr("compression is a hook itself"));
    }
    // Ranks with different hooks: an error everywhere, not a stall.
    DistributedOptimizerOptions differing =
        on_engine(*engine, rank == 0 ? allreduce_hook() : fp16_compress_hook());
    try {
      DistributedOptimizer optimizer(sgd, model, differing);
      ADD_FAILURE() << "ranks with different hooks were taken";
    } catch (const ContractError& e) {
      EXPECT_THAT(e.what(), HasSubstr("comm_hook="));
    }
    ot::finish(*engine);
  });
}

}  // namespace
}  // namespace kolo
