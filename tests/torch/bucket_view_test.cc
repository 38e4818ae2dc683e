// Gradients as bucket views (DistributedOptimizerOptions::gradient_as_bucket_view,
// docs/torch.md "Bucket views"), on 2 rank-threads:
//  - after backward (before step) every .grad() lies in its bucket's buffer:
//    the gradients of a bucket share one storage, end to end in bucket
//    order, at the same address as before backward (it accumulated in place);
//  - the copies per step: none in the pipeline, one engine request per
//    bucket instead of one per gradient, and no pass through the engine's
//    fusion buffer (its timeline's MEMCPY_IN/OUT_FUSION_BUFFER phases),
//    which the requests per gradient take on the threads backend;
//  - everything that touches .grad() trains bitwise as without the views:
//    local accumulation, zero_grad (the wrapped optimizer's, and
//    Module::zero_grad(set_to_none)), a parameter unused on one rank
//    (zero-fill), gradients replaced by a create_graph backward, PowerSGD,
//    LossScaler (unscale in place, an inf on one rank skipping the step),
//    a checkpoint saved and loaded into a new DistributedOptimizer (as an
//    elastic round builds one: the views move to its buffers), the Trainer;
//  - ZeRO stages 2 and 3 refuse the option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/torch/checkpoint.h"
#include "kolo/torch/comm_hook.h"
#include "kolo/torch/mixed_precision.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/trainer.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;
namespace zt = zero_testing;
using testing::run_with_engines;

constexpr int kWorld = 2;
constexpr int kSteps = 4;
constexpr int64_t kRows = 4;  // per rank and step

// fc1 -> fc2, plus a branch `extra` that a rank may leave unused.
struct Branchy : torch::nn::Module {
  Branchy() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    extra = register_module("extra", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_extra = true) {
    const torch::Tensor h = torch::relu(fc1(x));
    return use_extra ? fc2(h) + extra(h) : fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, extra{nullptr};
};

// Every bucket's gradients share one storage and lie end to end in bucket
// order (a buffer of the bucket's dtype, each gradient at its offset).
void expect_views(DistributedOptimizer& optimizer, Branchy& model, const std::string& what) {
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& item : model.named_parameters()) {
    by_name[optimizer.options().name_prefix + item.key()] = item.value();
  }
  for (const std::vector<std::string>& bucket : optimizer.buckets()) {
    const torch::Tensor first = by_name.at(bucket.front()).grad();
    ASSERT_TRUE(first.defined()) << what << " " << bucket.front();
    int64_t offset = first.storage_offset();
    for (const std::string& name : bucket) {
      const torch::Tensor grad = by_name.at(name).grad();
      ASSERT_TRUE(grad.defined()) << what << " " << name;
      EXPECT_TRUE(grad.is_alias_of(first))
          << what << ": " << name << " is not in the buffer of " << bucket.front();
      EXPECT_EQ(grad.storage_offset(), offset) << what << " " << name;
      EXPECT_TRUE(grad.is_contiguous()) << what << " " << name;
      EXPECT_FALSE(grad.is_view()) << what << " " << name;  // detach_() must work on it
      offset += grad.numel();
    }
  }
}

// What a scenario does at one step of one rank; the default is a plain step.
struct Step {
  int rank = 0;
  int step = 0;
  Branchy& model;
  torch::optim::Optimizer& inner;
  std::unique_ptr<DistributedOptimizer>& optimizer;
  std::function<std::unique_ptr<DistributedOptimizer>()> rebuild;  // a new one, same options
  torch::Tensor x, y;
  torch::Tensor loss() { return torch::nn::functional::cross_entropy(model.forward(x), y); }
};

struct Scenario {
  DistributedOptimizerOptions options;
  // Called on each run's options (e.g. a fresh hook: its state is per run).
  std::function<void(DistributedOptimizerOptions&)> configure = [](DistributedOptimizerOptions&) {};
  bool adam = false;
  std::function<void(Step&)> step = [](Step& s) {
    s.optimizer->zero_grad();
    s.loss().backward();
    s.optimizer->step();
  };
};

// Trains a copy of `initial` on each rank with and without bucket views and
// expects the parameters to end bitwise equal (and moved). With the views,
// checks after every step that the gradients are bucket views.
void expect_same_with_views(const Scenario& scenario, uint64_t seed = 5) {
  torch::manual_seed(static_cast<int64_t>(seed));
  Branchy initial;
  const torch::Tensor x = torch::randn({kSteps, kWorld * kRows, 8});
  const torch::Tensor y = torch::randint(0, 4, {kSteps, kWorld * kRows}, torch::kLong);
  std::vector<std::shared_ptr<Branchy>> trained[2];
  for (bool views : {false, true}) {
    auto& models = trained[views];
    for (int r = 0; r < kWorld; ++r) models.push_back(ot::clone_of(initial));
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      Branchy& model = *models[rank];
      std::unique_ptr<torch::optim::Optimizer> inner;
      if (scenario.adam) {
        inner = std::make_unique<torch::optim::Adam>(model.parameters(),
                                                     torch::optim::AdamOptions(1e-2));
      } else {
        inner = std::make_unique<torch::optim::SGD>(model.parameters(),
                                                    torch::optim::SGDOptions(0.1).momentum(0.9));
      }
      DistributedOptimizerOptions options = scenario.options;
      scenario.configure(options);
      options.engine = &engine;
      options.timeout = testing::kTorchTimeout;
      options.gradient_as_bucket_view = views;
      auto rebuild = [&] { return std::make_unique<DistributedOptimizer>(*inner, model, options); };
      std::unique_ptr<DistributedOptimizer> optimizer = rebuild();
      for (int s = 0; s < kSteps; ++s) {
        Step step{rank,
                  s,
                  model,
                  *inner,
                  optimizer,
                  rebuild,
                  x[s].slice(0, rank * kRows, (rank + 1) * kRows),
                  y[s].slice(0, rank * kRows, (rank + 1) * kRows)};
        scenario.step(step);
        if (views) expect_views(*optimizer, model, "step " + std::to_string(s));
      }
      ot::finish(engine);
    });
  }
  for (int r = 0; r < kWorld; ++r) {
    auto a = trained[1][r]->named_parameters();
    auto e = trained[0][r]->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i].value(), e[i].value()))
          << "rank " << r << " " << a[i].key() << ": max difference "
          << (a[i].value() - e[i].value()).abs().max().item<double>();
    }
  }
  EXPECT_GT((trained[1][0]->fc1->weight - initial.fc1->weight).abs().max().item<double>(), 1e-4);
}

class BucketView : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

// How many times `what` occurs in the file at `path`.
size_t occurrences(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  size_t count = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++count;
  return count;
}

TEST_F(BucketView, BackwardAccumulatesIntoTheBucketAndNothingIsCopied) {
  torch::manual_seed(3);
  Branchy initial;
  const torch::Tensor x = torch::randn({kSteps, kWorld * kRows, 8});
  const torch::Tensor y = torch::randint(0, 4, {kSteps, kWorld * kRows}, torch::kLong);
  testing::TempDir dir("kolo-bucket-view-timeline");
  const size_t n_params = initial.parameters().size();
  // Per rank, over steps 1.. (step 0 also moves the gradients once, to the
  // buffers of the rebuilt layout): requests the engine completed and copies
  // the pipeline made.
  std::map<bool, std::vector<uint64_t>> requests, copies;
  for (bool views : {false, true}) {
    requests[views].assign(kWorld, 0);
    copies[views].assign(kWorld, 0);
    std::vector<std::shared_ptr<Branchy>> models = {ot::clone_of(initial), ot::clone_of(initial)};
    EngineOptions engine_options = kolo::testing::test_engine_options();
    // Rank 0's timeline: the engine's MEMCPY_IN/OUT_FUSION_BUFFER phases.
    engine_options.timeline_path = dir.file(views ? "views.json" : "plain.json");
    ot::EngineWorld world("threads", kWorld);
    ot::run_ranks(kWorld, [&](int rank) {
      auto engine = world.engine(rank, engine_options);
      Branchy& model = *models[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
      DistributedOptimizerOptions options;
      options.engine = engine.get();
      options.timeout = testing::kTorchTimeout;
      options.gradient_as_bucket_view = views;
      // The default bucket_bytes: one bucket (the engine would fuse two small
      // buckets' requests too, as any small tensors; buckets above 256 KiB
      // it runs alone).
      DistributedOptimizer optimizer(sgd, model, options);
      ASSERT_EQ(optimizer.buckets().size(), 1u);
      uint64_t requests_before = 0, copies_before = 0;
      for (int s = 0; s < kSteps; ++s) {
        if (s == 1) {
          requests_before = engine->stats().responses;
          copies_before = optimizer.stats().copies;
        }
        std::vector<void*> before;
        for (const torch::Tensor& p : model.parameters()) {
          before.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
        }
        optimizer.zero_grad();
        torch::nn::functional::cross_entropy(
            model.forward(x[s].slice(0, rank * kRows, (rank + 1) * kRows)),
            y[s].slice(0, rank * kRows, (rank + 1) * kRows))
            .backward();
        if (views) {
          // After backward, before step: in the buffers, where they were.
          expect_views(optimizer, model, "after backward " + std::to_string(s));
          const auto params = model.parameters();
          for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_EQ(params[i].grad().data_ptr(), before[i]) << "step " << s << " param " << i;
          }
        }
        optimizer.step();
      }
      requests[views][rank] = engine->stats().responses - requests_before;
      copies[views][rank] = optimizer.stats().copies - copies_before;
      if (views) {
        // Construction zeroed undefined gradients in place; the rebuild
        // after step 0 moved each gradient once.
        EXPECT_LE(optimizer.stats().copies, n_params);
      }
      ot::finish(*engine);
    });
  }
  for (int r = 0; r < kWorld; ++r) {
    // No copies in the pipeline either way (no hook)...
    EXPECT_EQ(copies[true][r], 0u) << "rank " << r;
    EXPECT_EQ(copies[false][r], 0u) << "rank " << r;
    // ...and a request per gradient against one per bucket.
    EXPECT_EQ(requests[false][r], (kSteps - 1) * n_params) << "rank " << r;
    EXPECT_EQ(requests[true][r], (kSteps - 1) * 1u) << "rank " << r;
  }
  // The engine packed the requests of each step into its fusion buffer and
  // unpacked them (threads backend), and with the views never.
  EXPECT_GT(occurrences(dir.file("plain.json"), "MEMCPY_IN_FUSION_BUFFER"), 0u);
  EXPECT_GT(occurrences(dir.file("plain.json"), "MEMCPY_OUT_FUSION_BUFFER"), 0u);
  EXPECT_GT(occurrences(dir.file("views.json"), "ALLREDUCE"), 0u);
  EXPECT_EQ(occurrences(dir.file("views.json"), "MEMCPY_IN_FUSION_BUFFER"), 0u);
  EXPECT_EQ(occurrences(dir.file("views.json"), "MEMCPY_OUT_FUSION_BUFFER"), 0u);
}

TEST_F(BucketView, BackwardPassesPerStepAccumulateInTheView) {
  Scenario s;
  s.options.backward_passes_per_step = 2;
  s.step = [](Step& st) {
    st.optimizer->zero_grad();
    st.loss().backward();
    (st.loss() * 0.5).backward();
    st.optimizer->step();
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, ZeroGradOfTheOptimizerAndSetToNoneOfTheModule) {
  Scenario s;
  s.step = [](Step& st) {
    if (st.step % 2 == 0) {
      st.optimizer->zero_grad();  // the wrapped optimizer's: detach_() and zero_() in place
    } else {
      st.model.zero_grad(/*set_to_none=*/true);  // backward makes new gradients: copied back
      st.optimizer->zero_grad();
    }
    for (const torch::Tensor& p : st.model.parameters()) {
      if (p.grad().defined()) {
        EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
      }
    }
    const uint64_t copies = st.optimizer->stats().copies;
    st.loss().backward();
    st.optimizer->step();
    if (st.optimizer->options().gradient_as_bucket_view && st.step % 2 == 1) {
      // The new gradients were copied into their slots, once each.
      EXPECT_EQ(st.optimizer->stats().copies - copies, st.model.parameters().size());
    }
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, AParameterUnusedOnOneRankIsZeroFilled) {
  Scenario s;
  s.adam = true;
  s.step = [](Step& st) {
    st.optimizer->zero_grad();
    if (st.step == 2) st.model.extra->zero_grad(/*set_to_none=*/true);
    const uint64_t filled = st.optimizer->stats().zero_filled;
    torch::nn::functional::cross_entropy(st.model.forward(st.x, /*use_extra=*/st.rank == 0), st.y)
        .backward();
    st.optimizer->step();
    // Rank 1 sent zeros for extra: its gradient (defined, the average) is
    // rank 0's halved. At step 2 its gradients were undefined: zero-filled.
    if (st.rank == 1 && st.step == 2) {
      EXPECT_EQ(st.optimizer->stats().zero_filled - filled, 2u);
    }
    EXPECT_TRUE(st.model.extra->weight.grad().defined());
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, AGradientReplacedByACreateGraphBackwardIsCopiedBack) {
  Scenario s;
  s.step = [](Step& st) {
    st.optimizer->zero_grad();
    st.loss().backward({}, /*retain_graph=*/true, /*create_graph=*/st.step == 1);
    st.optimizer->step();
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, PowerSgdGetsTheBucketBuffer) {
  Scenario s;
  s.options.bucket_bytes = 500;  // two buckets: fc2 and extra, then fc1
  s.step = [](Step& st) {
    EXPECT_EQ(st.optimizer->buckets().size(), 2u);
    st.optimizer->zero_grad();
    st.loss().backward();
    st.optimizer->step();
  };
  s.configure = [](DistributedOptimizerOptions& o) {
    PowerSGDOptions psgd;
    psgd.rank = 1;
    psgd.start_step = 1;
    o.comm_hook = powersgd_hook(psgd);  // error feedback and Q: per rank and run
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, LossScalerUnscalesInPlaceAndAnInfSkipsTheStepEverywhere) {
  Scenario s;
  s.adam = true;
  s.step = [](Step& st) {
    // One per rank-thread, made at step 0 of each run.
    static thread_local std::unique_ptr<LossScaler> scaler;
    if (st.step == 0) {
      LossScalerOptions o;
      o.engine = st.optimizer->options().engine;
      o.timeout = testing::kTorchTimeout;
      o.growth_interval = 2;
      scaler = std::make_unique<LossScaler>(o);
    }
    st.optimizer->zero_grad();
    torch::Tensor loss = st.loss();
    if (st.rank == 1 && st.step == 1) loss = loss * std::numeric_limits<float>::infinity();
    scaler->scale(loss).backward();
    EXPECT_EQ(scaler->step(*st.optimizer), st.step != 1) << "rank " << st.rank;
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, ACheckpointLoadsIntoANewOptimizerWhoseViewsTakeOver) {
  testing::TempDir dir("kolo-bucket-view");
  Scenario s;
  s.adam = true;
  const std::string path = dir.path();
  s.step = [path](Step& st) {
    st.optimizer->zero_grad();
    st.loss().backward();
    st.optimizer->step();
    if (st.step == 1) {
      const std::string where =
          path + (st.optimizer->options().gradient_as_bucket_view ? "/views" : "/plain");
      CheckpointState state;
      state.step = 2;
      save_checkpoint(where, *st.optimizer, state);
      // As an elastic round: a new DistributedOptimizer over the same model.
      st.optimizer.reset();
      st.optimizer = st.rebuild();
      EXPECT_EQ(load_checkpoint(where, *st.optimizer).step, 2);
    }
  };
  expect_same_with_views(s);
}

TEST_F(BucketView, TheTrainerTrainsAsWithoutViews) {
  torch::manual_seed(9);
  constexpr int64_t kSamples = 32;
  const torch::Tensor x = torch::randn({kSamples, 7});
  const torch::Tensor y = torch::randint(0, 5, {kSamples}, torch::kLong);
  const Dataset data{kSamples, [&](const torch::Tensor& rows) {
                       return std::make_pair(x.index_select(0, rows), y.index_select(0, rows));
                     }};
  zt::ZeroNet initial;
  std::vector<std::shared_ptr<zt::ZeroNet>> trained[2];
  for (bool views : {false, true}) {
    for (int r = 0; r < kWorld; ++r) trained[views].push_back(zt::copy_of(initial));
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      zt::ZeroNet& model = *trained[views][rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      ParallelOptimizerOptions options = zt::factory_options(0, engine);
      options.gradient_as_bucket_view = views;
      auto optimizer = make_parallel_optimizer(sgd, model, options);
      TrainerOptions trainer_options;
      trainer_options.engine = &engine;
      trainer_options.timeout = testing::kTorchTimeout;
      trainer_options.epochs = 2;
      trainer_options.batch_size = 4;
      Trainer trainer(
          model, [&](const torch::Tensor& in) { return model.forward(in); },
          [](const torch::Tensor& out, const torch::Tensor& target) {
            return torch::nn::functional::cross_entropy(out, target);
          },
          *optimizer, trainer_options);
      trainer.fit(data);
      ot::finish(engine);
    });
  }
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*trained[1][r], *trained[0][r], 0, 0, "rank " + std::to_string(r));
  }
}

TEST_F(BucketView, ZeroStagesTwoAndThreeRefuseTheOption) {
  run_with_engines(1, [&](int /*rank*/, Engine& engine) {
    zt::ZeroNet model;
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    for (int stage : {2, 3}) {
      ParallelOptimizerOptions options = zt::factory_options(stage, engine);
      options.gradient_as_bucket_view = true;
      const std::string error =
          testing::error_of([&] { make_parallel_optimizer(sgd, model, options); });
      EXPECT_THAT(error, ::testing::HasSubstr("gradient_as_bucket_view")) << stage;
      EXPECT_THAT(error, ::testing::HasSubstr("use zero_stage 0 or 1")) << stage;
    }
    ParallelOptimizerOptions options = zt::factory_options(1, engine);
    options.gradient_as_bucket_view = true;  // stage 1 keeps its gradients as views anyway
    EXPECT_NO_THROW(make_parallel_optimizer(sgd, model, options));
    ot::finish(engine);
  });
}

}  // namespace
}  // namespace kolo
