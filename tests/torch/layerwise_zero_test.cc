// LARS and LAMB under ZeRO (kolo/torch/layerwise.h, "Sharding"): at stages
// 1, 2 and 3 they end with the same parameters as under DistributedOptimizer,
// at world sizes whose slices cut layers apart (the 174-element model of
// zero_harness.h: a slice holds the end of one layer and the start of the
// next, and most layers lie on two or three ranks), with buckets that hold
// several layers and with one bucket per layer, with the recipe's two groups;
// each step takes exactly one collective for the trust ratios; and a sharded
// checkpoint written at one world size and stage resumes at another.
//
// Tolerance: rtol 1e-5, atol 1e-6 (reduce-scatter and allreduce, and the
// partial sums of squares, add in different orders).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/torch/lamb.h"
#include "kolo/torch/lars.h"
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

constexpr int kSteps = 4;
constexpr int64_t kRowsPerRank = 3;
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

enum class Kind { kLars, kLamb };

std::unique_ptr<LayerwiseOptimizer> make_layerwise(Kind kind, zt::ZeroNet& model) {
  if (kind == Kind::kLars) {
    return std::make_unique<LARS>(layerwise_param_groups(
        model.named_parameters(),
        LARSOptions(0.5).momentum(0.9).weight_decay(1e-3).trust_coefficient(0.02)));
  }
  return std::make_unique<LAMB>(
      layerwise_param_groups(model.named_parameters(), LAMBOptions(0.02).weight_decay(0.01)));
}

struct Case {
  Kind kind = Kind::kLamb;
  int world = 3;
  int stage = 1;
  int64_t bucket_bytes = 32 << 20;
};

std::string describe(const Case& c) {
  return std::string(c.kind == Kind::kLars ? "LARS" : "LAMB") + " stage " +
         std::to_string(c.stage) + " world " + std::to_string(c.world) + " buckets of " +
         std::to_string(c.bucket_bytes) + " B";
}

// Trains a copy of `initial` per rank with make_parallel_optimizer at
// `stage` (0 = DistributedOptimizer); returns every rank's model (gathered)
// and, per rank, the optimizer's collectives for trust ratios and whether
// one of its pieces held runs of two layers.
struct Trained {
  std::vector<std::shared_ptr<zt::ZeroNet>> models;
  std::vector<int64_t> reductions;
  bool piece_spans_layers = false;
};

Trained train(const zt::ZeroNet& initial, const std::vector<zt::Batch>& batches, const Case& c,
              int stage) {
  Trained out;
  for (int r = 0; r < c.world; ++r) out.models.push_back(zt::copy_of(initial));
  out.reductions.assign(c.world, -1);
  std::mutex mutex;
  run_with_engines(c.world, [&](int rank, Engine& engine) {
    zt::ZeroNet& model = *out.models[rank];
    auto inner = make_layerwise(c.kind, model);
    ParallelOptimizerOptions options;
    options.zero_stage = stage;
    options.bucket_bytes = c.bucket_bytes;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    auto optimizer = make_parallel_optimizer(*inner, model, options);
    bool spans = false;
    if (const LayerLayout* layout = inner->layout()) {
      for (const auto& group : layout->runs) {
        for (const auto& piece : group) spans = spans || piece.size() > 1;
      }
    }
    for (const zt::Batch& batch : batches) {
      optimizer->zero_grad();
      zt::loss_of(model, batch.share(rank, c.world)).backward();
      optimizer->step();
    }
    if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) {
      // The state of this rank's elements only: LAMB's two moments, LARS's velocity.
      int64_t mine = 0;
      for (const auto& b : zero->buckets()) mine += b.shard_numel;
      EXPECT_EQ(zero->memory().optimizer_state_bytes, (c.kind == Kind::kLamb ? 8 : 4) * mine)
          << describe(c) << " rank " << rank;
      zero->gather_parameters();
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      out.reductions[rank] = inner->reductions();
      out.piece_spans_layers = out.piece_spans_layers || spans;
    }
    ot::finish(engine);
  });
  return out;
}

void expect_zero_matches_data_parallel(const Case& c) {
  torch::manual_seed(17);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(kSteps, c.world * kRowsPerRank);
  const Trained ddp = train(initial, batches, c, 0);
  const Trained zero = train(initial, batches, c, c.stage);
  for (int r = 0; r < c.world; ++r) {
    ot::expect_params_close(*zero.models[r], *ddp.models[r], kRtol, kAtol,
                            describe(c) + " rank " + std::to_string(r));
    // One collective per step for every layer's norms; none without sharding.
    EXPECT_EQ(zero.reductions[r], kSteps) << describe(c) << " rank " << r;
    EXPECT_EQ(ddp.reductions[r], 0) << describe(c) << " rank " << r;
  }
  // The run moved the parameters (the comparison is not vacuous).
  EXPECT_GT((ddp.models[0]->parameters()[0] - initial.parameters()[0]).abs().max().item<double>(),
            1e-3);
  if (c.world >= 3 && c.stage < 3 && c.bucket_bytes > 1000) {
    EXPECT_TRUE(zero.piece_spans_layers) << describe(c);
  }
}

class LayerwiseZero : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(LayerwiseZero, MatchesDistributedOptimizerWhereSlicesCutLayers) {
  const int stage = GetParam();
  for (Kind kind : {Kind::kLars, Kind::kLamb}) {
    for (int world : {3, 4}) {
      Case c;
      c.kind = kind;
      c.world = world;
      c.stage = stage;
      expect_zero_matches_data_parallel(c);
      if (stage < 3) {
        c.bucket_bytes = 200;  // a bucket per layer but fc1.bias + fc2.bias
        expect_zero_matches_data_parallel(c);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, LayerwiseZero, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

// Saved at world 3, stage 2 after two steps; resumed at world 2, stage 1
// (other slices, other pieces, the state created by a local step and then
// overwritten): the last two steps end where the uninterrupted run does.
TEST(LayerwiseZeroCheckpoint, ResumesAtAnotherWorldSizeAndStage) {
  torch::set_num_threads(1);
  torch::manual_seed(29);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(4, 6);  // rows divide by 3 and by 2
  for (Kind kind : {Kind::kLars, Kind::kLamb}) {
    testing::TempDir dir("kolo-layerwise-zero");
    std::vector<std::shared_ptr<zt::ZeroNet>> straight;
    for (int r = 0; r < 3; ++r) straight.push_back(zt::copy_of(initial));
    run_with_engines(3, [&](int rank, Engine& engine) {
      auto inner = make_layerwise(kind, *straight[rank]);
      ParallelOptimizerOptions options;
      options.zero_stage = 2;
      options.engine = &engine;
      options.timeout = testing::kTorchTimeout;
      auto optimizer = make_parallel_optimizer(*inner, *straight[rank], options);
      for (size_t s = 0; s < batches.size(); ++s) {
        if (s == 2) {
          CheckpointState saved;
          saved.step = 2;
          save_checkpoint(dir.path(), *optimizer, saved);
        }
        optimizer->zero_grad();
        zt::loss_of(*straight[rank], batches[s].share(rank, 3)).backward();
        optimizer->step();
      }
      dynamic_cast<ZeroOptimizer&>(*optimizer).gather_parameters();
      ot::finish(engine);
    });
    std::vector<std::shared_ptr<zt::ZeroNet>> resumed;
    for (int r = 0; r < 2; ++r) resumed.push_back(std::make_shared<zt::ZeroNet>());
    run_with_engines(2, [&](int rank, Engine& engine) {
      auto inner = make_layerwise(kind, *resumed[rank]);
      ParallelOptimizerOptions options;
      options.zero_stage = 1;
      options.engine = &engine;
      options.timeout = testing::kTorchTimeout;
      auto optimizer = make_parallel_optimizer(*inner, *resumed[rank], options);
      const CheckpointState state = load_checkpoint(dir.path(), *optimizer);
      EXPECT_EQ(inner->reductions(), 0);  // loading took no collective of the optimizer
      for (size_t s = static_cast<size_t>(state.step); s < batches.size(); ++s) {
        optimizer->zero_grad();
        zt::loss_of(*resumed[rank], batches[s].share(rank, 2)).backward();
        optimizer->step();
      }
      dynamic_cast<ZeroOptimizer&>(*optimizer).gather_parameters();
      ot::finish(engine);
    });
    for (int r = 0; r < 2; ++r) {
      ot::expect_params_close(
          *resumed[r], *straight[0], kRtol, kAtol,
          std::string(kind == Kind::kLars ? "LARS" : "LAMB") + " rank " + std::to_string(r));
    }
  }
}

}  // namespace
}  // namespace kolo
