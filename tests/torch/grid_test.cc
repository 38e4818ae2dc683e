// The parallel grid with ranks as threads (4 rank-threads, each with an engine
// for the collectives and a world communicator for the pipeline's
// transfers): a model of MLP blocks trained on (dp=2, pp=2), (tp=2, dp=2) and
// (pp=2, tp=2) ends each step with the same loss and parameters as one
// process training the unsplit model on the whole global batch, with
// DistributedOptimizer or ZeRO stage 1 across the data-parallel dimension.
// Also the grid's layout and its errors.
//
// Tolerance: float32 gradients summed in other orders (micro-batches,
// replicas, tensor slices): parameters to rtol 1e-4, atol 1e-6 after 3 SGD
// steps with momentum; losses to rtol 1e-5.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <array>
#include <map>
#include <set>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/parallel_grid.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/pipeline.h"
#include "kolo/torch/tensor_parallel.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::run_ranks;
using testing::ThreadEngines;

constexpr int kWorld = 4;
constexpr int kSteps = 3;
constexpr int64_t kBatch = 16;
constexpr int64_t kHidden = 8;
constexpr int64_t kFfn = 12;
constexpr int kBlocks = 2;
constexpr double kLr = 0.05;

// The unsplit model: kBlocks MLP blocks (Linear h->f, GELU, Linear f->h),
// then a Linear h->4 head: 3 * kBlocks + 1 modules.
torch::nn::Sequential unsplit_model() {
  torch::nn::Sequential model;
  for (int b = 0; b < kBlocks; ++b) {
    model->push_back(torch::nn::Linear(kHidden, kFfn));
    model->push_back(torch::nn::GELU());
    model->push_back(torch::nn::Linear(kFfn, kHidden));
  }
  model->push_back(torch::nn::Linear(kHidden, 4));
  return model;
}

torch::nn::Sequential copy_of(const torch::nn::Sequential& source) {
  auto copy = unsplit_model();
  torch::NoGradGuard no_grad;
  auto to = copy->parameters();
  auto from = source->parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

// The same model with tensor-parallel blocks (weights taken from `source`):
// kBlocks ParallelMLPs, then the replicated head.
torch::nn::Sequential tensor_parallel_model(const torch::nn::Sequential& source, Engine& engine,
                                            int process_set) {
  torch::nn::Sequential model;
  for (int b = 0; b < kBlocks; ++b) {
    TensorParallelOptions o;
    o.engine = &engine;
    o.process_set = process_set;
    o.timeout = kTorchTimeout;
    o.name = "block" + std::to_string(b);
    ParallelMLP mlp(kHidden, kFfn, o);
    auto fc1 = source->ptr(3 * b)->as<torch::nn::Linear>();
    auto fc2 = source->ptr(3 * b + 2)->as<torch::nn::Linear>();
    mlp->fc1->from_full(fc1->weight.detach(), fc1->bias.detach());
    mlp->fc2->from_full(fc2->weight.detach(), fc2->bias.detach());
    model->push_back(mlp);
  }
  torch::nn::Linear head(kHidden, 4);
  {
    torch::NoGradGuard no_grad;
    auto from = source->ptr(3 * kBlocks)->as<torch::nn::Linear>();
    head->weight.copy_(from->weight);
    head->bias.copy_(from->bias);
  }
  model->push_back(head);
  return model;
}

torch::Tensor loss_fn(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(kLr).momentum(0.9); }

struct Data {
  std::vector<torch::Tensor> x, y;
};

Data make_data() {
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({kBatch, kHidden}));
    d.y.push_back(torch::randn({kBatch, 4}));
  }
  return d;
}

// One process, the whole batch: the losses of each step; `model` is trained.
std::vector<double> reference_run(torch::nn::Sequential model, const Data& data) {
  torch::optim::SGD sgd(model->parameters(), sgd_options());
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    torch::Tensor loss = loss_fn(model->forward(data.x[s]), data.y[s]);
    loss.backward();
    sgd.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected,
                  const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const torch::Tensor diff = (actual - expected).abs();
  EXPECT_TRUE(torch::all(diff <= 1e-6 + 1e-4 * expected.abs()).item<bool>())
      << what << ": max diff " << diff.max().item<double>();
}

void finish(Engine& engine) {
  float x = 0;
  TensorView v{&x, DType::kF32, {}};
  engine.allreduce("test/finish", v, v);
}

struct GridCase {
  int dp, pp, tp;
  int zero_stage;
};

class ParallelGridTraining : public ::testing::TestWithParam<GridCase> {};

TEST_P(ParallelGridTraining, MatchesTheSingleProcessRun) {
  const GridCase c = GetParam();
  const int m = 4;  // micro-batches when pp > 1
  torch::manual_seed(5);
  const auto init = unsplit_model();
  const Data data = make_data();
  std::vector<torch::nn::Sequential> copies;  // built on this thread (one generator)
  for (int r = 0; r < kWorld; ++r) copies.push_back(copy_of(init));

  ThreadEngines engines(kWorld);
  auto comms = make_thread_communicators(kWorld, kTorchTimeout);
  std::vector<std::vector<double>> losses(kWorld);
  // Each rank's trained parameters by unsplit name ("3.weight"), gathered
  // whole where the rank holds a tensor slice.
  std::vector<std::map<std::string, torch::Tensor>> trained(kWorld);
  run_ranks(kWorld, [&](int rank) {
    std::unique_ptr<Engine> engine = engines.engine(rank);
    ParallelGridOptions grid_options;
    grid_options.engine = engine.get();
    ParallelGrid grid{c.dp, c.pp, c.tp, grid_options};
    const int64_t rows = kBatch / c.dp;  // this replica's share of the global batch
    auto replica = [&](const torch::Tensor& t) { return t.narrow(0, grid.dp_rank() * rows, rows); };
    torch::nn::Sequential model =
        c.tp > 1 ? tensor_parallel_model(copies[rank], *engine, grid.tp_set()) : copies[rank];

    ParallelOptimizerOptions dp_options;
    dp_options.engine = engine.get();
    dp_options.process_set = grid.dp_set();
    dp_options.timeout = kTorchTimeout;
    dp_options.zero_stage = c.zero_stage;
    dp_options.name_prefix =
        "grad/pp" + std::to_string(grid.pp_rank()) + "/tp" + std::to_string(grid.tp_rank()) + "/";
    if (c.pp > 1) {
      PipelineOptions options;
      options.micro_batches = m;
      options.communicator = comms[rank].get();
      options.stage_ranks = grid.pp_ranks();
      options.timeout = kTorchTimeout;
      options.balance = PipelineBalance::kManual;
      options.stage_sizes = c.tp > 1 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 4};
      options.optimizer_averages_micro_batches = true;
      Pipeline pipe(model, options);
      torch::optim::SGD sgd(pipe.parameters(), sgd_options());
      dp_options.backward_passes_per_step = m;
      auto optimizer = make_parallel_optimizer(sgd, *pipe.module(), dp_options);
      for (int s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        torch::Tensor loss = pipe.train_step(replica(data.x[s]), replica(data.y[s]), loss_fn);
        optimizer->step();
        if (pipe.is_last()) losses[rank].push_back(loss.item<double>());
      }
      model = pipe.module();
    } else {
      torch::optim::SGD sgd(model->parameters(), sgd_options());
      auto optimizer = make_parallel_optimizer(sgd, *model, dp_options);
      for (int s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        torch::Tensor loss = loss_fn(model->forward(replica(data.x[s])), replica(data.y[s]));
        loss.backward();
        optimizer->step();
        losses[rank].push_back(loss.item<double>());
      }
    }
    // Unsplit names: the tensor-parallel blocks' layers are modules 3b and 3b+2.
    for (const auto& item : model->named_children()) {
      const int index = std::stoi(item.key());
      if (auto mlp = item.value()->as<ParallelMLPImpl>()) {
        const int block_start = c.tp > 1 ? 3 * index : index;
        trained[rank][std::to_string(block_start) + ".weight"] = mlp->fc1->full_weight();
        trained[rank][std::to_string(block_start) + ".bias"] = mlp->fc1->full_bias();
        trained[rank][std::to_string(block_start + 2) + ".weight"] = mlp->fc2->full_weight();
        trained[rank][std::to_string(block_start + 2) + ".bias"] = mlp->fc2->bias.detach();
      } else {
        const int unsplit = c.tp > 1 ? 3 * kBlocks : index;
        for (const auto& p : item.value()->named_parameters()) {
          trained[rank][std::to_string(unsplit) + "." + p.key()] = p.value().detach().clone();
        }
      }
    }
    finish(*engine);
  });

  auto reference = copy_of(init);
  const std::vector<double> expected = reference_run(reference, data);
  // Every replica's last stage reports its share's loss; their mean is the batch's.
  std::vector<double> mean(kSteps, 0.0);
  int reporters = 0;
  for (int r = 0; r < kWorld; ++r) {
    if (losses[r].empty()) continue;
    ASSERT_EQ(losses[r].size(), static_cast<size_t>(kSteps));
    ++reporters;
    for (int s = 0; s < kSteps; ++s) mean[s] += losses[r][s];
  }
  ASSERT_EQ(reporters, c.dp * c.tp);
  for (int s = 0; s < kSteps; ++s) {
    mean[s] /= reporters;
    // Losses are computed before each step's update: all but the first
    // follow the updated parameters, so they check the updates too.
    EXPECT_NEAR(mean[s], expected[s], 1e-5 * std::abs(expected[s]) + 1e-7) << "step " << s;
  }
  const auto want = reference->named_parameters();
  std::set<std::string> covered;
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& [name, value] : trained[r]) {
      ASSERT_TRUE(want.contains(name)) << name;
      expect_close(value, want[name], name + " on rank " + std::to_string(r));
      covered.insert(name);
    }
  }
  EXPECT_EQ(covered.size(), want.size()) << "some parameters were trained by no rank";
}

INSTANTIATE_TEST_SUITE_P(Grids, ParallelGridTraining,
                         ::testing::Values(GridCase{2, 2, 1, 0}, GridCase{2, 2, 1, 1},
                                           GridCase{2, 1, 2, 0}, GridCase{2, 1, 2, 1},
                                           GridCase{1, 2, 2, 0}),
                         [](const auto& info) {
                           const GridCase& c = info.param;
                           return "dp" + std::to_string(c.dp) + "_pp" + std::to_string(c.pp) +
                                  "_tp" + std::to_string(c.tp) + "_zero" +
                                  std::to_string(c.zero_stage);
                         });

TEST(ParallelGridLayout, RanksAndGroupsFollowMegatronsOrder) {
  ThreadEngines engines(8);
  std::vector<std::vector<int>> dp(8), pp(8), tp(8);
  std::vector<std::array<int, 3>> coordinates(8);
  run_ranks(8, [&](int rank) {
    std::unique_ptr<Engine> engine = engines.engine(rank);
    ParallelGridOptions options;
    options.engine = engine.get();
    ParallelGrid grid{2, 2, 2, options};
    coordinates[rank] = {grid.dp_rank(), grid.pp_rank(), grid.tp_rank()};
    dp[rank] = grid.dp_ranks();
    pp[rank] = grid.pp_ranks();
    tp[rank] = grid.tp_ranks();
    EXPECT_EQ(grid.rank_of(grid.dp_rank(), grid.pp_rank(), grid.tp_rank()), rank);
    // The sets are usable: a sum over each group.
    for (int set : {grid.dp_set(), grid.tp_set()}) {
      float x = 1;
      TensorView v{&x, DType::kF32, {}};
      RequestOptions o;
      o.op = ReduceOp::kSum;
      o.process_set = set;
      engine->allreduce("grid/check/" + std::to_string(set), v, v, o);
      EXPECT_EQ(x, 2.0f);
    }
    finish(*engine);
  });
  EXPECT_EQ(coordinates[5], (std::array<int, 3>{0, 1, 1}));  // 5 = (1 * 2 + 0) * 2 + 1
  EXPECT_EQ(tp[5], (std::vector<int>{4, 5}));
  EXPECT_EQ(dp[5], (std::vector<int>{5, 7}));
  EXPECT_EQ(pp[5], (std::vector<int>{1, 5}));
}

TEST(ParallelGridLayout, ASizeThatIsNotTheWorldIsAContractError) {
  ThreadEngines engines(4);
  run_ranks(4, [&](int rank) {
    std::unique_ptr<Engine> engine = engines.engine(rank);
    ParallelGridOptions options;
    options.engine = engine.get();
    try {
      ParallelGrid grid{3, 1, 1, options};
      ADD_FAILURE() << "no error";
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("dp=3 x pp=1 x tp=1 must equal the 4 ranks"),
                std::string::npos)
          << e.what();
    }
    finish(*engine);
  });
}

}  // namespace
}  // namespace kolo
