// DistributedOptimizer behaviour: allreduces start inside backward() (last
// layer first, in buckets), parameters without a gradient on some rank, frozen
// parameters, synchronize() before step(), process sets, sparse gradients,
// and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/comm_hook.h"
#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;

using ot::clone_of;
using ot::EngineWorld;
using ot::kEngineTimeout;
using ot::Mlp;
using ::testing::HasSubstr;

class OptimizerBehaviour : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

DistributedOptimizerOptions with_engine(Engine& engine) {
  DistributedOptimizerOptions o;
  o.engine = &engine;
  o.timeout = kEngineTimeout;
  return o;
}

// Three layers, so that the first layer's gradient arrives well after the
// last layer's.
struct Deep : torch::nn::Module {
  Deep() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// How many gradients are with the engine when fc1.weight's tensor hook runs
// (just before its gradient is accumulated, at the very end of backward()),
// per step, for the given bucket size. Also checks that when backward()
// returns every gradient has been submitted, none by step(), and that the
// ranks stay identical.
std::vector<int64_t> submitted_before_first_layer(int64_t bucket_bytes) {
  constexpr int n = 2;
  constexpr int kSteps = 3;
  torch::manual_seed(1);
  Deep initial;
  const torch::Tensor x = torch::randn({n * 4, 8});
  const torch::Tensor y = torch::randint(0, 4, {n * 4}, torch::kLong);
  std::vector<std::shared_ptr<Deep>> models = {clone_of(initial), clone_of(initial)};
  std::vector<std::vector<int64_t>> counts(n);
  EngineWorld world("threads", n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Deep& model = *models[rank];
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizerOptions options = with_engine(*engine);
    options.bucket_bytes = bucket_bytes;
    DistributedOptimizer optimizer(sgd, model.named_parameters(), options);
    for (int step = 0; step < kSteps; ++step) {
      std::atomic<int64_t> before_fc1{-1};
      const uint64_t before = optimizer.stats().hook_submissions;
      auto hook = model.fc1->weight.register_hook([&](const torch::Tensor& grad) {
        before_fc1 = static_cast<int64_t>(optimizer.stats().hook_submissions - before);
        return grad;
      });
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(
          model.forward(x.slice(0, rank * 4, rank * 4 + 4)), y.slice(0, rank * 4, rank * 4 + 4));
      loss.backward();
      EXPECT_EQ(optimizer.stats().hook_submissions - before, 6u);
      optimizer.step();
      model.fc1->weight.remove_hook(hook);
      counts[rank].push_back(before_fc1.load());
    }
    EXPECT_EQ(optimizer.stats().step_submissions, 0u);
    ot::finish(*engine);
  });
  ot::expect_params_close(*models[0], *models[1], 0, 0, "rank 1 vs rank 0");
  std::vector<int64_t> all = counts[0];
  all.insert(all.end(), counts[1].begin(), counts[1].end());
  return all;
}

TEST_F(OptimizerBehaviour, UnbucketedAllreducesStartInsideBackwardLastLayerFirst) {
  // bucket_bytes = 0: each gradient goes the moment it is ready, so fc3
  // (weight, bias) and fc2 (weight, bias) at least are with the engine before
  // fc1.weight exists; fc1.bias may come before or after it.
  for (int64_t count : submitted_before_first_layer(0)) EXPECT_GE(count, 4);
}

TEST_F(OptimizerBehaviour, BucketsGoWhenFullOrWithTheLastGradient) {
  // Gradient bytes: fc3 16 + 512, fc2 128 + 4096, fc1 128 + 1024. A 1 KiB
  // bucket fills with fc2.weight, so it and the gradients before it (3 or 4,
  // as fc2.bias comes before or after fc2.weight) go before fc1.weight
  // exists; the rest close with the last gradient.
  for (int64_t count : submitted_before_first_layer(1024)) {
    EXPECT_GE(count, 3);
    EXPECT_LE(count, 4);
  }
  // The default 25 MiB never fills: all six go together with the last one.
  for (int64_t count : submitted_before_first_layer(DistributedOptimizerOptions{}.bucket_bytes)) {
    EXPECT_EQ(count, 0);
  }
}

// A model with a branch that rank 1 never takes.
struct Branchy : torch::nn::Module {
  Branchy() {
    trunk = register_module("trunk", torch::nn::Linear(8, 4));
    branch = register_module("branch", torch::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool take_branch) {
    torch::Tensor out = trunk(x);
    return take_branch ? out + branch(x) : out;
  }
  torch::nn::Linear trunk{nullptr}, branch{nullptr};
};

TEST_F(OptimizerBehaviour, ParameterUnusedOnOneRankIsSentAsZerosAndStaysConsistent) {
  constexpr int n = 2;
  constexpr int kSteps = 4;
  torch::manual_seed(2);
  Branchy initial;
  std::vector<torch::Tensor> xs;
  std::vector<torch::Tensor> ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({n * 5, 8}));
    ys.push_back(torch::randint(0, 4, {n * 5}, torch::kLong));
  }
  auto loss_of = [&](Branchy& m, int step, int rank) {
    return torch::nn::functional::cross_entropy(
        m.forward(xs[step].slice(0, rank * 5, rank * 5 + 5), /*take_branch=*/rank == 0),
        ys[step].slice(0, rank * 5, rank * 5 + 5));
  };

  // Reference: one process, loss = mean of the ranks' losses (the gradient
  // of the branch comes from rank 0's half alone).
  auto expected = clone_of(initial);
  {
    torch::optim::Adam adam(expected->parameters(), torch::optim::AdamOptions(1e-2));
    for (int s = 0; s < kSteps; ++s) {
      adam.zero_grad();
      ((loss_of(*expected, s, 0) + loss_of(*expected, s, 1)) / 2).backward();
      adam.step();
    }
  }

  std::vector<std::shared_ptr<Branchy>> models = {clone_of(initial), clone_of(initial)};
  std::vector<DistributedOptimizer::Stats> stats(n);
  EngineWorld world("threads", n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Branchy& model = *models[rank];
    torch::optim::Adam adam(model.parameters(), torch::optim::AdamOptions(1e-2));
    // Unbucketed, so that the hooks that do fire submit at once (with
    // buckets, rank 1's open bucket would wait for the branch and go from
    // step(); the outcome is the same).
    DistributedOptimizerOptions options = with_engine(*engine);
    options.bucket_bytes = 0;
    DistributedOptimizer optimizer(adam, model.named_parameters(), options);
    for (int s = 0; s < kSteps; ++s) {
      optimizer.zero_grad();
      loss_of(model, s, rank).backward();
      optimizer.step();
    }
    stats[rank] = optimizer.stats();
    ot::finish(*engine);
  });
  // Rank 1 sent the branch's two gradients from step() every step, as zeros
  // the first time (undefined), then as zero_grad()'s zeros.
  EXPECT_EQ(stats[0].step_submissions, 0u);
  EXPECT_EQ(stats[1].step_submissions, 2u * kSteps);
  EXPECT_EQ(stats[1].zero_filled, 2u);
  EXPECT_EQ(stats[1].hook_submissions, 2u * kSteps);
  ot::expect_params_close(*models[1], *models[0], 0, 0, "rank 1 vs rank 0");
  ot::expect_params_close(*models[0], *expected, 1e-5, 1e-6, "rank 0 vs one process");
}

TEST_F(OptimizerBehaviour, FrozenParametersAreSkippedOnEveryRank) {
  constexpr int n = 2;
  torch::manual_seed(3);
  Mlp initial;
  std::vector<std::shared_ptr<Mlp>> models = {clone_of(initial), clone_of(initial)};
  const torch::Tensor frozen_before = initial.fc1->weight.detach().clone();
  EngineWorld world("threads", n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Mlp& model = *models[rank];
    model.fc1->weight.set_requires_grad(false);
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizer optimizer(sgd, model.named_parameters(), with_engine(*engine));
    EXPECT_EQ(optimizer.gradient_names(),
              (std::vector<std::string>{"grad/fc1.bias", "grad/fc2.weight", "grad/fc2.bias"}));
    for (int s = 0; s < 2; ++s) {
      optimizer.zero_grad();
      ot::loss_of(model, torch::randn({4, 8}), torch::randint(0, 4, {4}, torch::kLong)).backward();
      optimizer.step();
    }
    EXPECT_EQ(optimizer.stats().hook_submissions, 6u);
    ot::finish(*engine);
  });
  EXPECT_TRUE(torch::equal(models[0]->fc1->weight, frozen_before));
  ot::expect_params_close(*models[1], *models[0], 0, 0, "rank 1 vs rank 0");
}

TEST_F(OptimizerBehaviour, SynchronizeThenClipThenStep) {
  constexpr int n = 2;
  torch::manual_seed(4);
  Mlp initial;
  std::vector<std::shared_ptr<Mlp>> models = {clone_of(initial), clone_of(initial)};
  const torch::Tensor x = torch::randn({n * 4, 8});
  const torch::Tensor y = torch::randint(0, 4, {n * 4}, torch::kLong);
  // Reference: the averaged gradient, clipped to norm 0.01, one SGD step.
  auto expected = clone_of(initial);
  {
    torch::optim::SGD sgd(expected->parameters(), torch::optim::SGDOptions(1.0));
    ot::loss_of(*expected, x, y).backward();
    torch::nn::utils::clip_grad_norm_(expected->parameters(), 0.01);
    sgd.step();
  }
  EngineWorld world("threads", n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Mlp& model = *models[rank];
    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(1.0));
    DistributedOptimizer optimizer(sgd, model.named_parameters(), with_engine(*engine));
    ot::loss_of(model, x.slice(0, rank * 4, rank * 4 + 4), y.slice(0, rank * 4, rank * 4 + 4))
        .backward();
    optimizer.synchronize();
    torch::nn::utils::clip_grad_norm_(model.parameters(), 0.01);
    optimizer.step();  // does not reduce the clipped gradients again
    EXPECT_EQ(optimizer.stats().steps, 1u);
    ot::finish(*engine);
  });
  ot::expect_params_close(*models[0], *expected, 1e-5, 1e-6, "rank 0 vs one process");
  ot::expect_params_close(*models[1], *models[0], 0, 0, "rank 1 vs rank 0");
}

TEST_F(OptimizerBehaviour, ProcessSetReducesAmongItsMembersOnly) {
  constexpr int n = 3;
  torch::manual_seed(5);
  Mlp initial;
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < n; ++r) models.push_back(clone_of(initial));
  const torch::Tensor x = torch::randn({n * 4, 8});
  const torch::Tensor y = torch::randint(0, 4, {n * 4}, torch::kLong);
  auto expected = clone_of(initial);  // ranks 0 and 2's rows in one batch
  {
    torch::optim::SGD sgd(expected->parameters(), torch::optim::SGDOptions(0.5));
    torch::Tensor rows = torch::cat({x.slice(0, 0, 4), x.slice(0, 8, 12)});
    torch::Tensor labels = torch::cat({y.slice(0, 0, 4), y.slice(0, 8, 12)});
    ot::loss_of(*expected, rows, labels).backward();
    sgd.step();
  }
  EngineWorld world("threads", n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    const int set = engine->add_process_set({0, 2}).id();
    if (rank != 1) {
      Mlp& model = *models[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.5));
      DistributedOptimizerOptions o = with_engine(*engine);
      o.process_set = set;
      DistributedOptimizer optimizer(sgd, model.named_parameters(), o);
      ot::loss_of(model, x.slice(0, rank * 4, rank * 4 + 4), y.slice(0, rank * 4, rank * 4 + 4))
          .backward();
      optimizer.step();
    }
    ot::finish(*engine);
  });
  ot::expect_params_close(*models[0], *expected, 1e-5, 1e-6, "rank 0 vs one process");
  ot::expect_params_close(*models[2], *models[0], 0, 0, "rank 2 vs rank 0");
  ot::expect_params_close(*models[1], initial, 0, 0, "rank 1 (not a member)");
}

// --- Errors ------------------------------------------------------------------

TEST_F(OptimizerBehaviour, AnotherBackwardBeforeStepIsAnErrorBeforeTheGradientIsTouched) {
  EngineWorld world("threads", 1);
  auto engine = world.engine(0);
  Mlp model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  DistributedOptimizer optimizer(sgd, model.named_parameters(), with_engine(*engine));
  const torch::Tensor x = torch::randn({4, 8});
  const torch::Tensor y = torch::randint(0, 4, {4}, torch::kLong);
  ot::loss_of(model, x, y).backward();
  try {
    ot::loss_of(model, x, y).backward();
    ADD_FAILURE() << "a second backward() before step() did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("backward_passes_per_step (1)"));
    EXPECT_THAT(e.what(), HasSubstr("grad/fc2."));
  }
  // The first pass's reduction is intact and the optimizer goes on.
  optimizer.step();
  EXPECT_EQ(optimizer.stats().steps, 1u);
  optimizer.zero_grad();
  ot::loss_of(model, x, y).backward();
  optimizer.step();
  EXPECT_EQ(optimizer.stats().steps, 2u);
  ot::finish(*engine);
}

TEST_F(OptimizerBehaviour, ZeroGradWhileAllreducesRunIsAnError) {
  EngineWorld world("threads", 1);
  auto engine = world.engine(0);
  Mlp model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  DistributedOptimizer optimizer(sgd, model.named_parameters(), with_engine(*engine));
  ot::loss_of(model, torch::randn({4, 8}), torch::randint(0, 4, {4}, torch::kLong)).backward();
  try {
    optimizer.zero_grad();
    ADD_FAILURE() << "zero_grad() with running allreduces did not throw";
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("zero_grad"));
    EXPECT_THAT(e.what(), HasSubstr("call step() or synchronize() first"));
  }
  optimizer.step();
  optimizer.zero_grad();
  ot::finish(*engine);
}

// With the default bucket, a rank that skipped a branch has submitted nothing
// when backward() returns: its gradients wait in the open bucket for the
// branch's. zero_grad() is refused there too, as it is on a rank whose bucket
// went (above), so the outcome does not depend on the bucket size or on which
// parameters a rank used. Between the passes of a local accumulation it is
// allowed and restarts the accumulation.
TEST_F(OptimizerBehaviour, ZeroGradWithAGradientQueuedInABucketIsAnError) {
  EngineWorld world("threads", 1);
  auto engine = world.engine(0);
  torch::manual_seed(4);
  Branchy model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  DistributedOptimizer optimizer(sgd, model.named_parameters(), with_engine(*engine));
  const torch::Tensor x = torch::randn({4, 8});
  const torch::Tensor y = torch::randint(0, 4, {4}, torch::kLong);
  torch::nn::functional::cross_entropy(model.forward(x, /*take_branch=*/false), y).backward();
  EXPECT_EQ(optimizer.stats().hook_submissions, 0u);  // trunk's two gradients are queued
  try {
    optimizer.zero_grad();
    ADD_FAILURE() << "zero_grad() with a queued gradient did not throw";
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("zero_grad"));
    EXPECT_THAT(e.what(), HasSubstr("grad/trunk."));
    EXPECT_THAT(e.what(), HasSubstr("queued in a bucket"));
    EXPECT_THAT(e.what(), HasSubstr("call step() or synchronize() first"));
  }
  // The queued gradients were kept: step() reduces them with the branch's zeros.
  const torch::Tensor trunk_grad = model.trunk->weight.grad().clone();
  optimizer.step();
  EXPECT_EQ(optimizer.stats().steps, 1u);
  EXPECT_TRUE(torch::equal(model.trunk->weight.grad(), trunk_grad));
  optimizer.zero_grad();

  // Mid-accumulation (1 of 2 passes) nothing is queued: zero_grad() restarts it.
  Branchy accumulating;
  torch::optim::SGD sgd2(accumulating.parameters(), torch::optim::SGDOptions(0.1));
  DistributedOptimizerOptions options = with_engine(*engine);
  options.backward_passes_per_step = 2;
  options.name_prefix = "accumulating/";
  DistributedOptimizer twice(sgd2, accumulating.named_parameters(), options);
  torch::nn::functional::cross_entropy(accumulating.forward(x, true), y).backward();
  twice.zero_grad();
  for (int pass = 0; pass < 2; ++pass)
    torch::nn::functional::cross_entropy(accumulating.forward(x, true), y).backward();
  twice.step();
  EXPECT_EQ(twice.stats().steps, 1u);
  ot::finish(*engine);
}

// An embedding with sparse=true: its gradient is averaged dense and handed
// back sparse (the same sparse_dim), holding exactly the rows some rank
// touched, with a request per gradient (the default) and through a
// communication hook.
TEST_F(OptimizerBehaviour, SparseGradientsAreAveragedDenseAndHandedBackSparse) {
  constexpr int kWorld = 3;
  // Rank r looks up rows {r, 4, 4} (row 4 twice: an uncoalesced gradient).
  auto rows_of = [](int rank) { return torch::tensor({int64_t{rank}, int64_t{4}, int64_t{4}}); };
  torch::Tensor expected = torch::zeros({6, 2});
  for (int r = 0; r < kWorld; ++r) expected.index_add_(0, rows_of(r), torch::ones({3, 2}));
  expected /= kWorld;
  for (const char* mode : {"per gradient", "hook"}) {
    SCOPED_TRACE(mode);
    EngineWorld engines("threads", kWorld);
    ot::run_ranks(kWorld, [&](int rank) {
      auto engine = engines.engine(rank);
      torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(6, 2).sparse(true));
      torch::nn::Linear dense(2, 1);  // a dense gradient in the same step
      {
        torch::NoGradGuard no_grad;
        dense->weight.fill_(0.5);  // d sum(dense(e)) / de = 0.5 per looked-up row element
      }
      DistributedOptimizerOptions o = with_engine(*engine);
      if (std::string(mode) == "hook") {
        o.comm_hook = make_comm_hook("allreduce", [](CommBucket& bucket) {
          return CommFuture(allreduce_async_(bucket.buffer, bucket.name, bucket.reduce));
        });
      }
      DistributedOptimizer optimizer(
          {{"embedding.weight", embedding->weight}, {"dense.weight", dense->weight}}, o);
      for (int step = 0; step < 2; ++step) {
        optimizer.zero_grad();
        dense(embedding(rows_of(rank))).sum().backward();
        ASSERT_TRUE(embedding->weight.grad().is_sparse());
        optimizer.synchronize();
        const torch::Tensor grad = embedding->weight.grad();
        ASSERT_TRUE(grad.is_sparse()) << "step " << step;
        EXPECT_EQ(grad.sparse_dim(), 1);
        // Rows 0..kWorld-1 and 4, each once.
        EXPECT_EQ(grad.coalesce().indices().numel(), kWorld + 1);
        ot::expect_close(grad.to_dense(), expected * 0.5, 1e-6, 1e-7,
                         "step " + std::to_string(step) + " rank " + std::to_string(rank));
      }
      ot::finish(*engine);
    });
  }
}

TEST_F(OptimizerBehaviour, InvalidOptionsAreContractErrors) {
  EngineWorld world("threads", 1);
  auto engine = world.engine(0);
  Mlp model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  auto expect_error = [&](DistributedOptimizerOptions o, const std::string& text) {
    try {
      DistributedOptimizer optimizer(sgd, model.named_parameters(), o);
      ADD_FAILURE() << "no error for " << text;
    } catch (const ContractError& e) {
      EXPECT_THAT(e.what(), HasSubstr(text));
      EXPECT_THAT(e.what(), HasSubstr("DistributedOptimizer"));
    }
  };
  DistributedOptimizerOptions o = with_engine(*engine);
  o.op = ReduceOp::kMax;
  expect_error(o, "options.op is max");
  o = with_engine(*engine);
  o.backward_passes_per_step = 0;
  expect_error(o, "backward_passes_per_step is 0");
  o = with_engine(*engine);
  o.op = ReduceOp::kSum;
  o.gradient_predivide_factor = 2;
  expect_error(o, "needs ReduceOp::kAverage");
  o = with_engine(*engine);
  o.gradient_predivide_factor = 0;
  expect_error(o, "gradient_predivide_factor is 0");
  o = with_engine(*engine);
  o.bucket_bytes = -1;
  expect_error(o, "bucket_bytes is -1");
  // A parameter of the optimizer that named_parameters does not name.
  auto named = model.named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> partial = {{named[0].key(), named[0].value()}};
  try {
    DistributedOptimizer optimizer(sgd, partial, with_engine(*engine));
    ADD_FAILURE() << "no error for an unnamed parameter";
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter 1 of parameter group 0 has no name"));
  }
  EXPECT_THROW(parse_compression("int8"), ContractError);
  EXPECT_EQ(parse_compression("bf16"), Compression::kBf16);
  ot::finish(*engine);
}

TEST_F(OptimizerBehaviour, DifferentModelsOnTheRanksAreAnErrorOnEveryRank) {
  constexpr int n = 2;
  EngineWorld world("threads", n);
  std::vector<std::shared_ptr<torch::nn::Linear>> models = {
      std::make_shared<torch::nn::Linear>(8, 4), std::make_shared<torch::nn::Linear>(8, 5)};
  std::vector<std::string> errors(n);
  ot::run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    torch::nn::Linear& model = *models[rank];
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    try {
      DistributedOptimizer optimizer(sgd, model->named_parameters(), with_engine(*engine));
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
    ot::finish(*engine);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("grad/weight Float [5, 8]")) << "rank " << r;
    EXPECT_THAT(errors[r], HasSubstr("expected grad/weight Float [4, 8]")) << "rank " << r;
  }
}

TEST_F(OptimizerBehaviour, UnnamedParametersAreNamedByGroupAndIndex) {
  EngineWorld world("threads", 1);
  auto engine = world.engine(0);
  Mlp model;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model.fc1->parameters());
  groups.emplace_back(model.fc2->parameters());
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
  DistributedOptimizer optimizer(sgd, with_engine(*engine));
  EXPECT_EQ(optimizer.gradient_names(),
            (std::vector<std::string>{"grad/0.0", "grad/0.1", "grad/1.0", "grad/1.1"}));
  ot::loss_of(model, torch::randn({4, 8}), torch::randint(0, 4, {4}, torch::kLong)).backward();
  optimizer.step();
  EXPECT_EQ(optimizer.stats().hook_submissions, 4u);
  ot::finish(*engine);
}

}  // namespace
}  // namespace kolo
