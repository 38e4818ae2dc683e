// ParallelOptimizer and the gradient pipeline under both optimizers:
//  - the factory at every zero_stage trains exactly as zero_stage 0
//    (DistributedOptimizer), also with local accumulation over two backward
//    passes (which the pipeline now gives every ZeRO stage), and
//    synchronize() before step() changes nothing;
//  - options a ZeRO stage cannot honour, and a stage that does not exist,
//    are ContractErrors on every rank;
//  - a synchronize-only DistributedOptimizer (no torch optimizer, as the
//    Python frontend uses it) reduces exactly as the wrapping one;
//  - DistributedOptimizer lays its buckets out by readiness: reverse
//    parameter order until the first step, then the order in which rank 0's
//    gradients became ready;
//  - a gradient computed after its last pass is refused at every ZeRO stage.
#include <gtest/gtest.h>
#include <torch/torch.h>

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
using zt::factory_options;

constexpr int kSteps = 3;
constexpr int64_t kRowsPerPass = 3;  // per rank

struct TrainingRun {
  int world = 2;
  int stage = 0;
  zt::Kind kind = zt::Kind::kAdam;
  int passes = 1;            // backward_passes_per_step
  bool synchronize = false;  // synchronize() before each step()
};

// Trains a copy of `initial` on every rank; returns rank 0's model (stage 3:
// gathered). Pass p of rank r in a step reads rows block (p * world + r).
std::shared_ptr<zt::ZeroNet> train(const zt::ZeroNet& initial,
                                   const std::vector<zt::Batch>& batches, const TrainingRun& run) {
  std::vector<std::shared_ptr<zt::ZeroNet>> models;
  for (int r = 0; r < run.world; ++r) models.push_back(zt::copy_of(initial));
  run_with_engines(run.world, [&](int rank, Engine& engine) {
    zt::ZeroNet& model = *models[rank];
    auto inner = zt::make_optimizer(run.kind, model.parameters());
    ParallelOptimizerOptions options = factory_options(run.stage, engine);
    options.backward_passes_per_step = run.passes;
    std::unique_ptr<ParallelOptimizer> optimizer = make_parallel_optimizer(*inner, model, options);
    EXPECT_EQ(optimizer->zero_stage(), run.stage);
    EXPECT_EQ(optimizer->rank(), rank);
    EXPECT_EQ(optimizer->world_size(), run.world);
    for (const zt::Batch& batch : batches) {
      optimizer->zero_grad();
      for (int pass = 0; pass < run.passes; ++pass) {
        const zt::Batch mine = batch.share(pass * run.world + rank, run.passes * run.world);
        zt::loss_of(model, mine).backward();
      }
      if (run.synchronize) optimizer->synchronize();
      optimizer->step();
    }
    // Stage 3: the full parameters stay in the model after the optimizer.
    if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
    ot::finish(engine);
  });
  for (int r = 1; r < run.world; ++r) {
    ot::expect_params_close(*models[r], *models[0], 1e-5, 1e-6, "rank " + std::to_string(r));
  }
  return models[0];
}

TEST(ParallelOptimizer, EveryZeroStageFromTheFactoryTrainsAsStageZero) {
  torch::set_num_threads(1);
  for (int passes : {1, 2}) {
    for (zt::Kind kind : {zt::Kind::kSgd, zt::Kind::kAdam}) {
      torch::manual_seed(21);
      zt::ZeroNet initial;
      const auto batches = zt::make_batches(kSteps, 3 * passes * kRowsPerPass);
      TrainingRun run;
      run.world = 3;
      run.kind = kind;
      run.passes = passes;
      const auto expected = train(initial, batches, run);
      EXPECT_GT((expected->parameters()[0] - initial.parameters()[0]).abs().max().item<double>(),
                1e-3);
      for (int stage : {1, 2, 3}) {
        for (bool synchronize : {false, true}) {
          run.stage = stage;
          run.synchronize = synchronize;
          const std::string what = "stage " + std::to_string(stage) + ", " +
                                   std::to_string(passes) + " pass(es)" +
                                   (synchronize ? ", synchronize() first" : "");
          ot::expect_params_close(*train(initial, batches, run), *expected, 1e-5, 1e-6, what);
        }
      }
    }
  }
}

TEST(ParallelOptimizer, OptionsAStageCannotHonourAreErrorsOnEveryRank) {
  torch::set_num_threads(1);
  auto expect_error = [](const std::function<void(ParallelOptimizerOptions&)>& change,
                         const std::string& text) {
    run_with_engines(2, [&](int rank, Engine& engine) {
      zt::ZeroNet model;
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
      ParallelOptimizerOptions options = factory_options(2, engine);
      change(options);
      const std::string error =
          testing::error_of([&] { make_parallel_optimizer(sgd, model, options); });
      EXPECT_NE(error.find(text), std::string::npos) << "rank " << rank << ": " << error;
      ot::finish(engine);
    });
  };
  expect_error([](auto& o) { o.zero_stage = 4; }, "options.zero_stage is 4");
  expect_error([](auto& o) { o.compression = Compression::kFp16; },
               "options.compression is fp16; zero_stage 2 reduce-scatters full-precision");
  expect_error([](auto& o) { o.op = ReduceOp::kSum; }, "options.op is sum; zero_stage 2");
  expect_error([](auto& o) { o.gradient_predivide_factor = 2; },
               "gradient_predivide_factor is 2.000000; zero_stage 2");
  expect_error([](auto& o) { o.backward_passes_per_step = 0; }, "backward_passes_per_step is 0");
}

TEST(ParallelOptimizer, SynchronizeOnlyReducesAsTheWrappingOptimizer) {
  torch::set_num_threads(1);
  torch::manual_seed(22);
  ot::Mlp initial;
  const auto batches = ot::make_batches(kSteps, 2 * 4);
  std::vector<std::shared_ptr<ot::Mlp>> wrapped, bare;
  for (int r = 0; r < 2; ++r) {
    wrapped.push_back(ot::clone_of(initial));
    bare.push_back(ot::clone_of(initial));
  }
  run_with_engines(2, [&](int rank, Engine& engine) {
    DistributedOptimizerOptions options;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    torch::optim::Adam adam(wrapped[rank]->parameters(), torch::optim::AdamOptions(1e-2));
    DistributedOptimizer with(adam, *wrapped[rank], options);
    // The Python frontend's way: kolo sees only the parameters.
    torch::optim::Adam own(bare[rank]->parameters(), torch::optim::AdamOptions(1e-2));
    options.name_prefix = "bare/";
    DistributedOptimizer without(bare[rank]->named_parameters().pairs(), options);
    EXPECT_THROW(without.step(), ContractError);
    EXPECT_THROW(without.optimizer(), ContractError);
    for (const ot::Batch& batch : batches) {
      const torch::Tensor x = batch.rows(rank, 4, batch.x);
      const torch::Tensor y = batch.rows(rank, 4, batch.y);
      with.zero_grad();
      ot::loss_of(*wrapped[rank], x, y).backward();
      with.step();
      without.zero_grad();
      for (const auto& p : bare[rank]->parameters()) {
        if (p.grad().defined()) {
          EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
        }
      }
      ot::loss_of(*bare[rank], x, y).backward();
      without.synchronize();
      own.step();
    }
    EXPECT_EQ(without.stats().steps, static_cast<uint64_t>(kSteps));
    ot::expect_params_close(*bare[rank], *wrapped[rank], 0, 0, "rank " + std::to_string(rank));
    ot::finish(engine);
  });
}

// Registered last layer first, run first layer first: reverse registration
// order is the opposite of the order backward() produces the gradients.
struct Registered : torch::nn::Module {
  Registered() {
    out = register_module("out", torch::nn::Linear(16, 4));
    in = register_module("in", torch::nn::Linear(8, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(in(x))); }
  torch::nn::Linear out{nullptr}, in{nullptr};
};

TEST(ParallelOptimizer, DataParallelBucketsFollowRankZerosReadinessAfterTheFirstStep) {
  torch::set_num_threads(1);
  run_with_engines(2, [&](int rank, Engine& engine) {
    Registered model;
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizerOptions options;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    // in.bias 64 B + in.weight 512 B | out.bias 16 B + out.weight 256 B, in
    // either order within a layer.
    options.bucket_bytes = 270;
    DistributedOptimizer optimizer(sgd, model, options);
    using Names = std::vector<std::vector<std::string>>;
    // Reverse parameter order: in.bias, in.weight | out.bias, out.weight.
    EXPECT_EQ(optimizer.buckets(),
              (Names{{"grad/in.bias", "grad/in.weight"}, {"grad/out.bias", "grad/out.weight"}}));
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      torch::nn::functional::cross_entropy(model.forward(torch::randn({4, 8})),
                                           torch::randint(0, 4, {4}, torch::kLong))
          .backward();
      optimizer.step();
      // From the first step on: "out" (ready first) leads.
      const Names buckets = optimizer.buckets();
      ASSERT_EQ(buckets.size(), 2u);
      EXPECT_EQ(buckets[0].size(), 2u);
      EXPECT_EQ(buckets[0][0].rfind("grad/out.", 0), 0u) << buckets[0][0];
      EXPECT_EQ(buckets[1][0].rfind("grad/in.", 0), 0u) << buckets[1][0];
    }
    EXPECT_EQ(optimizer.stats().step_submissions, 0u);
    (void)rank;
    ot::finish(engine);
  });
}

TEST(ParallelOptimizer, ZeroRefusesAGradientAfterItsLastPassAtEveryStage) {
  torch::set_num_threads(1);
  for (int stage : {1, 2, 3}) {
    run_with_engines(1, [&](int, Engine& engine) {
      zt::ZeroNet model;
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
      auto optimizer = make_parallel_optimizer(sgd, model, factory_options(stage, engine));
      const zt::Batch batch = zt::make_batches(1, 3).front();
      zt::loss_of(model, batch).backward();
      // Thrown from a hook inside backward: autograd may rethrow it as another type.
      std::string error;
      try {
        zt::loss_of(model, batch).backward();
      } catch (const std::exception& e) {
        error = e.what();
      }
      EXPECT_NE(error.find("kolo::ZeroOptimizer: the gradient of 'fc2."), std::string::npos)
          << "stage " << stage << ": " << error;
      EXPECT_NE(error.find("backward_passes_per_step (1)"), std::string::npos) << error;
      // The first pass's gradients are intact: the step goes on.
      optimizer->step();
      optimizer->zero_grad();
      ot::finish(engine);
    });
  }
}

// The one checkpoint call: a run saved after two steps and resumed in fresh
// models and optimizers ends where the uninterrupted run does, at every stage.
TEST(ParallelOptimizer, OneCheckpointCallResumesEveryStage) {
  torch::set_num_threads(1);
  constexpr int kWorld = 2;
  torch::manual_seed(23);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(4, kWorld * kRowsPerPass);
  for (int stage : {0, 1, 2, 3}) {
    testing::TempDir dir("kolo-parallel-checkpoint");
    std::vector<std::shared_ptr<zt::ZeroNet>> straight, resumed;
    for (int r = 0; r < kWorld; ++r) {
      straight.push_back(zt::copy_of(initial));
      resumed.push_back(zt::copy_of(initial));
    }
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      auto train = [&](zt::ZeroNet& model, ParallelOptimizer& optimizer, size_t from, size_t to) {
        for (size_t s = from; s < to; ++s) {
          optimizer.zero_grad();
          zt::loss_of(model, batches[s].share(rank, kWorld)).backward();
          optimizer.step();
        }
      };
      {
        auto adam = zt::make_optimizer(zt::Kind::kAdam, straight[rank]->parameters());
        auto optimizer =
            make_parallel_optimizer(*adam, *straight[rank], factory_options(stage, engine));
        train(*straight[rank], *optimizer, 0, 2);
        CheckpointState state;
        state.epoch = 1;
        state.step = 2;
        save_checkpoint(dir.path(), *optimizer, state);
        train(*straight[rank], *optimizer, 2, batches.size());
        if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      }
      auto adam = zt::make_optimizer(zt::Kind::kAdam, resumed[rank]->parameters());
      auto optimizer =
          make_parallel_optimizer(*adam, *resumed[rank], factory_options(stage, engine));
      const CheckpointState state = load_checkpoint(dir.path(), *optimizer);
      EXPECT_EQ(state.epoch, 1);
      EXPECT_EQ(state.step, 2);
      train(*resumed[rank], *optimizer, static_cast<size_t>(state.step), batches.size());
      if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      ot::finish(engine);
    });
    for (int r = 0; r < kWorld; ++r) {
      ot::expect_params_close(*resumed[r], *straight[r], 1e-6, 1e-7,
                              "stage " + std::to_string(stage) + " rank " + std::to_string(r));
    }
  }
}

// One schema: a checkpoint saved at one stage and world size resumes at any
// other, and the resumed run ends where the uninterrupted one does (the same
// global batches: every world splits each step's 12 rows evenly).
TEST(ParallelOptimizer, ACheckpointOfAnyStageResumesAtAnyOtherStageAndWorldSize) {
  torch::set_num_threads(1);
  torch::manual_seed(24);
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(4, 12);
  auto train = [&](zt::ZeroNet& model, ParallelOptimizer& optimizer, int rank, int world,
                   size_t from, size_t to) {
    for (size_t s = from; s < to; ++s) {
      optimizer.zero_grad();
      zt::loss_of(model, batches[s].share(rank, world)).backward();
      optimizer.step();
    }
  };
  struct Case {
    int stage, world, resume_stage, resume_world;
  };
  for (const Case c :
       {Case{0, 2, 2, 3}, Case{0, 3, 3, 1}, Case{3, 2, 0, 3}, Case{1, 3, 0, 1}, Case{2, 1, 1, 2}}) {
    const std::string what = "saved at stage " + std::to_string(c.stage) + " x" +
                             std::to_string(c.world) + ", resumed at stage " +
                             std::to_string(c.resume_stage) + " x" + std::to_string(c.resume_world);
    testing::TempDir dir("kolo-any-stage");
    // Uninterrupted, and saved after two steps.
    auto straight = zt::copy_of(initial);
    std::vector<std::shared_ptr<zt::ZeroNet>> first;
    for (int r = 0; r < c.world; ++r) first.push_back(r == 0 ? straight : zt::copy_of(initial));
    run_with_engines(c.world, [&](int rank, Engine& engine) {
      auto adam = zt::make_optimizer(zt::Kind::kAdam, first[rank]->parameters());
      auto optimizer =
          make_parallel_optimizer(*adam, *first[rank], factory_options(c.stage, engine));
      train(*first[rank], *optimizer, rank, c.world, 0, 2);
      CheckpointState state;
      state.step = 2;
      state.extras["note"] = what;
      save_checkpoint(dir.path(), *optimizer, state);
      train(*first[rank], *optimizer, rank, c.world, 2, batches.size());
      if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      ot::finish(engine);
    });
    // Resumed elsewhere.
    std::vector<std::shared_ptr<zt::ZeroNet>> second;
    for (int r = 0; r < c.resume_world; ++r) second.push_back(zt::copy_of(initial));
    run_with_engines(c.resume_world, [&](int rank, Engine& engine) {
      auto adam = zt::make_optimizer(zt::Kind::kAdam, second[rank]->parameters());
      auto optimizer =
          make_parallel_optimizer(*adam, *second[rank], factory_options(c.resume_stage, engine));
      const CheckpointState state = load_checkpoint(dir.path(), *optimizer);
      EXPECT_EQ(state.step, 2) << what;
      EXPECT_EQ(state.extras.at("note"), what);
      train(*second[rank], *optimizer, rank, c.resume_world, 2, batches.size());
      if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) zero->gather_parameters();
      ot::finish(engine);
    });
    for (int r = 0; r < c.resume_world; ++r) {
      ot::expect_params_close(*second[r], *straight, 1e-5, 1e-6,
                              what + ", rank " + std::to_string(r));
    }
  }
}

}  // namespace
}  // namespace kolo
