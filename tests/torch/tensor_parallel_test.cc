// Tensor-parallel layers with ranks as threads (one engine per rank-thread):
// at group sizes 1-4, ColumnParallelLinear (gathered or not),
// RowParallelLinear (parallel input or not), ParallelMLP and ParallelEmbedding
// give the unsplit layers' outputs, input gradients and weight gradients (the
// weight gradients as this rank's slice of the unsplit ones). Dimensions do
// not divide by the group size, so uneven shards are covered too.
//
// Tolerance: float32, the group's sum of partial products in another order
// than one matrix product: rtol 1e-5, atol 1e-6.
#include "kolo/torch/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::run_with_engines;

TensorParallelOptions tp(Engine& engine, const std::string& name) {
  TensorParallelOptions o;
  o.engine = &engine;
  o.timeout = kTorchTimeout;
  o.name = name;
  return o;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected,
                  const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double worst = (actual - expected).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-6)) << what << ": max diff " << worst;
}

// Every rank must call the engine until all are done (shutdown is collective).
void finish(Engine& engine) {
  float x = 0;
  TensorView v{&x, DType::kF32, {}};
  engine.allreduce("test/finish", v, v);
}

class TensorParallel : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallel, ColumnAndRowLinearMatchTheUnsplitLayer) {
  const int t = GetParam();
  torch::manual_seed(1);
  torch::nn::Linear full(7, 10);
  const torch::Tensor x = torch::randn({5, 7});
  const torch::Tensor up = torch::randn({5, 10});  // gradient arriving at the output
  // The unsplit layer's output and gradients.
  torch::Tensor x_ref = x.clone().requires_grad_(true);
  torch::Tensor y_ref = full(x_ref);
  y_ref.backward(up);
  run_with_engines(t, [&](int rank, Engine& engine) {
    for (bool gather : {true, false}) {
      ColumnParallelLinear column(7, 10, tp(engine, gather ? "col_g" : "col"), true, gather);
      column->from_full(full->weight.detach(), full->bias.detach());
      const Shard s = column->shard();
      torch::Tensor xi = x.clone().requires_grad_(true);
      torch::Tensor y = column(xi);
      const std::string what = "column gather=" + std::to_string(gather) + " rank " +
                               std::to_string(rank) + " of " + std::to_string(t);
      if (gather) {
        expect_close(y, y_ref.detach(), what + " output");
        y.backward(up);
      } else {
        expect_close(y, y_ref.detach().narrow(1, s.start, s.size), what + " output");
        y.backward(up.narrow(1, s.start, s.size));
      }
      expect_close(xi.grad(), x_ref.grad(), what + " input grad");
      expect_close(column->weight.grad(), full->weight.grad().narrow(0, s.start, s.size),
                   what + " weight grad");
      expect_close(column->bias.grad(), full->bias.grad().narrow(0, s.start, s.size),
                   what + " bias grad");
      expect_close(column->full_weight(), full->weight.detach(), what + " full_weight");
    }
    for (bool parallel_input : {true, false}) {
      RowParallelLinear row(7, 10, tp(engine, parallel_input ? "row_p" : "row"), true,
                            parallel_input);
      row->from_full(full->weight.detach(), full->bias.detach());
      const Shard s = row->shard();
      torch::Tensor xi = (parallel_input ? x.narrow(1, s.start, s.size) : x).clone();
      xi.requires_grad_(true);
      torch::Tensor y = row(xi);
      const std::string what = "row parallel_input=" + std::to_string(parallel_input) + " rank " +
                               std::to_string(rank) + " of " + std::to_string(t);
      expect_close(y, y_ref.detach(), what + " output");
      y.backward(up);
      expect_close(xi.grad(),
                   parallel_input ? x_ref.grad().narrow(1, s.start, s.size) : x_ref.grad(),
                   what + " input grad");
      expect_close(row->weight.grad(), full->weight.grad().narrow(1, s.start, s.size),
                   what + " weight grad");
      expect_close(row->bias.grad(), full->bias.grad(), what + " bias grad");
      expect_close(row->full_weight(), full->weight.detach(), what + " full_weight");
    }
    finish(engine);
  });
}

TEST_P(TensorParallel, ParallelMLPMatchesTheUnsplitMLP) {
  const int t = GetParam();
  torch::manual_seed(2);
  torch::nn::Linear fc1(6, 9), fc2(9, 6);
  const torch::Tensor x = torch::randn({2, 3, 6});  // leading dimensions are kept
  torch::Tensor x_ref = x.clone().requires_grad_(true);
  torch::Tensor y_ref = fc2(torch::gelu(fc1(x_ref)));
  y_ref.sum().backward();
  run_with_engines(t, [&](int rank, Engine& engine) {
    ParallelMLP mlp(6, 9, tp(engine, "mlp"));
    mlp->fc1->from_full(fc1->weight.detach(), fc1->bias.detach());
    mlp->fc2->from_full(fc2->weight.detach(), fc2->bias.detach());
    torch::Tensor xi = x.clone().requires_grad_(true);
    torch::Tensor y = mlp(xi);
    const std::string what = "mlp rank " + std::to_string(rank) + " of " + std::to_string(t);
    expect_close(y, y_ref.detach(), what + " output");
    y.sum().backward();
    expect_close(xi.grad(), x_ref.grad(), what + " input grad");
    const Shard s1 = mlp->fc1->shard();
    expect_close(mlp->fc1->weight.grad(), fc1->weight.grad().narrow(0, s1.start, s1.size),
                 what + " fc1 weight grad");
    expect_close(mlp->fc2->weight.grad(), fc2->weight.grad().narrow(1, s1.start, s1.size),
                 what + " fc2 weight grad");
    expect_close(mlp->fc2->bias.grad(), fc2->bias.grad(), what + " fc2 bias grad");
    finish(engine);
  });
}

TEST_P(TensorParallel, ParallelEmbeddingMatchesTheUnsplitEmbedding) {
  const int t = GetParam();
  torch::manual_seed(3);
  torch::nn::Embedding full(11, 4);
  const torch::Tensor ids = torch::tensor({{0, 10, 3}, {7, 7, 5}}, torch::kLong);
  torch::Tensor y_ref = full(ids);
  const torch::Tensor up = torch::randn({2, 3, 4});
  y_ref.backward(up);
  run_with_engines(t, [&](int rank, Engine& engine) {
    ParallelEmbedding embedding(11, 4, tp(engine, "embedding"));
    embedding->from_full(full->weight.detach());
    const Shard s = embedding->shard();
    torch::Tensor y = embedding(ids);
    const std::string what = "embedding rank " + std::to_string(rank) + " of " + std::to_string(t);
    expect_close(y, y_ref.detach(), what + " output");
    y.backward(up);
    expect_close(embedding->weight.grad(), full->weight.grad().narrow(0, s.start, s.size),
                 what + " weight grad");
    expect_close(embedding->full_weight(), full->weight.detach(), what + " full_weight");
    finish(engine);
  });
}

// The constructors initialise the whole layer as torch does (same generator
// state on every rank) and keep their shard.
TEST_P(TensorParallel, ConstructorsTakeTheirShardOfTorchsInitialisation) {
  const int t = GetParam();
  torch::manual_seed(4);
  torch::nn::Linear expected(5, 6);
  std::vector<torch::Tensor> gathered(t);
  run_with_engines(t, [&](int rank, Engine& engine) {
    static std::mutex generator;  // ranks as threads share torch's generator
    ColumnParallelLinear column{nullptr};
    {
      std::lock_guard<std::mutex> lock(generator);
      torch::manual_seed(4);
      column = ColumnParallelLinear(5, 6, tp(engine, "init"));
    }
    gathered[rank] = column->full_weight();
    finish(engine);
  });
  for (int r = 0; r < t; ++r) expect_close(gathered[r], expected->weight.detach(), "init");
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, TensorParallel, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

TEST(TensorParallelErrors, NamesAndSplitsAreChecked) {
  run_with_engines(2, [&](int, Engine& engine) {
    EXPECT_THROW(ColumnParallelLinear(4, 4, tp(engine, "")), ContractError);
    EXPECT_THROW(RowParallelLinear(1, 4, tp(engine, "too_narrow")), ContractError);
    ParallelEmbedding embedding(4, 2, tp(engine, "e"));
    EXPECT_THROW(embedding(torch::zeros({2}, torch::kInt)), ContractError);
    finish(engine);
  });
}

// A layer built with other dimensions on one rank of its group (a config
// that differs between ranks) is an error at its first forward, on every
// rank, naming each rank's dimensions, not a model that trains on
// mismatched slices.
TEST(TensorParallelErrors, RanksThatBuildDifferentDimensionsAreRefused) {
  std::vector<std::string> errors(2);
  run_with_engines(2, [&](int rank, Engine& engine) {
    ColumnParallelLinear fc1(16, rank == 1 ? 512 : 64, tp(engine, "fc1"));
    errors[rank] = testing::error_of([&] { fc1(torch::randn({2, 16})); });
    RowParallelLinear fc2(64, 16, tp(engine, "fc2"), rank == 0);
    EXPECT_THROW(fc2(torch::randn({2, 32})), ContractError);
    ParallelEmbedding embedding(rank == 0 ? 10 : 12, 4, tp(engine, "emb"));
    EXPECT_THROW(embedding(torch::zeros({3}, torch::kLong)), ContractError);
    finish(engine);
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("ColumnParallelLinear 'fc1'"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 0 of the group: in_features 16, out_features 64"), std::string::npos)
        << error;
    EXPECT_NE(error.find("rank 1 of the group: in_features 16, out_features 512"),
              std::string::npos)
        << error;
  }
}

}  // namespace
}  // namespace kolo
