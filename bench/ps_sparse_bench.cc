// `kolo-bench ps --models sparse` (ps_bench.h), one rank: an embedding table
// of --rows x 64 and a small MLP on synthetic click data, trained with
// Adagrad (lr --lr) either
//   design ps         the table on the servers (kolo::ps::Embedding: a step
//                     pulls and pushes only its batch's unique rows) and the
//                     MLP on the same servers' dense path (kolo::ps::Worker):
//                     one step, one clock, and the MLP's few KB ride along;
//   design allreduce  every worker holds the whole table and the MLP and
//                     allreduces their whole gradient each step
//                     (DistributedOptimizer), as a dense embedding would.
// Click data: a sample is kFields row ids drawn with a heavy head (row =
// rows * u^kSkew, u uniform), and its label is a coin with probability
// sigmoid(sum of a hidden score per row): a lower held-out log-loss means the
// table has learnt the hidden scores. Worker w trains on its own samples
// (seeded by w), worker 0 measures the held-out loss of the final parameters
// (test_metric), the loss the hidden model itself reaches on those samples
// (the floor) and the loss of the initial parameters.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/parameter_server.h"
#include "kolo/torch/ps_embedding.h"
#include "ps_bench.h"

namespace kolo::bench {
namespace {

constexpr int64_t kDim = 64;
constexpr int64_t kFields = 8;
constexpr double kSkew = 6.0;        // P(row < x) = (x / rows)^(1 / kSkew)
constexpr double kHiddenGain = 2.0;  // logit = gain * sum of scores / sqrt(fields)

struct Clicks {
  torch::Tensor ids;    // (n, kFields) int64
  torch::Tensor y;      // (n) float, 0 or 1
  torch::Tensor logit;  // (n) the hidden model's logit
};

// The hidden score of every row: a one-column table of its own seed.
ps::EmbeddingOptions hidden_scores(int64_t rows) {
  ps::EmbeddingOptions h;
  h.name = "hidden";
  h.rows = rows;
  h.dim = 1;
  h.init_scale = 1.0;
  h.seed = 20260;
  return h;
}

Clicks make_clicks(int64_t rows, int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  Clicks c;
  c.ids = torch::rand({n, kFields}, torch::kDouble)
              .pow(kSkew)
              .mul(static_cast<double>(rows))
              .floor()
              .clamp(0, static_cast<double>(rows - 1))
              .to(torch::kLong);
  const ps::EmbeddingOptions hidden = hidden_scores(rows);
  c.logit = torch::zeros({n});
  const int64_t* ids = c.ids.data_ptr<int64_t>();
  float* logit = c.logit.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int64_t f = 0; f < kFields; ++f) {
      sum += ps::embedding_init(hidden, ids[i * kFields + f], 1).item<float>();
    }
    logit[i] = static_cast<float>(kHiddenGain / std::sqrt(static_cast<double>(kFields))) * sum;
  }
  c.y = torch::bernoulli(torch::sigmoid(c.logit)).to(torch::kFloat);
  return c;
}

// The MLP on the mean of a sample's embeddings.
struct HeadImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  HeadImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kDim, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  // embedded (B, kFields, kDim) -> logits (B)
  torch::Tensor forward(const torch::Tensor& embedded) {
    return fc2->forward(torch::relu(fc1->forward(embedded.mean(1)))).squeeze(1);
  }
};
TORCH_MODULE(Head);

double log_loss(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::binary_cross_entropy_with_logits(logits, y).item<double>();
}

}  // namespace

int run_ps_sparse_worker(const PsWorkerOptions& o) {
  torch::set_num_threads(1);
  kolo::init();
  const bool ps = o.design == "ps";
  if (o.rows < 1) throw ContractError("kolo-bench ps: --rows must be >= 1");
  ps::EmbeddingOptions table;
  table.name = "clicks";
  table.rows = o.rows;
  table.dim = kDim;
  table.init_scale = 0.05;
  table.seed = 42;
  table.optimizer.lr = o.lr;
  torch::manual_seed(42);  // every rank builds the same MLP
  Head head;
  auto make_adagrad = [&](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::Adagrad>(std::move(params),
                                                   torch::optim::AdagradOptions(o.lr));
  };
  ps::PsOptions ps_options;
  ps_options.mode = ps::parse_mode(o.mode, "kolo-bench ps --mode");
  ps_options.max_staleness = o.max_staleness;

  ps::Links links;
  int workers = kolo::size();
  int worker = kolo::rank();
  if (ps) {
    links = ps::connect(kolo::runtime());
    workers = links.roles.workers;
    if (links.roles.is_server()) {
      const ps::Roles roles = links.roles;
      ps::Server server(head->named_parameters(), make_adagrad, std::move(links), ps_options);
      auto shard = std::make_shared<ps::EmbeddingTable>(table, roles);
      server.add_table(shard);
      server.run();
      const ps::Server::Stats stats = server.stats();
      nlohmann::json row = {{"role", "server"},
                            {"rank", kolo::rank()},
                            {"updates", stats.staleness.updates},
                            {"rows_read", shard->stats().rows_read},
                            {"rows_written", shard->stats().rows_written},
                            {"max_staleness_seen", stats.staleness.max_staleness},
                            {"lost", stats.lost.size()}};
      std::cout << row.dump() << std::endl;
      kolo::shutdown();
      return 0;
    }
  }

  const int64_t per_worker = o.train_subset / workers;
  const int64_t steps_per_epoch = per_worker / o.batch;
  if (steps_per_epoch < 1) {
    throw ContractError("kolo-bench ps: --train-subset " + std::to_string(o.train_subset) +
                        " gives " + std::to_string(per_worker) +
                        " samples per worker, less than one batch of " + std::to_string(o.batch));
  }
  const Clicks train = make_clicks(o.rows, per_worker, 1000 + static_cast<uint64_t>(worker));
  Clicks test;
  if (worker == 0) test = make_clicks(o.rows, o.test_subset, 7);

  std::unique_ptr<ps::Worker> ps_worker;
  std::unique_ptr<ps::Embedding> embedding;
  torch::Tensor weight;  // allreduce: the whole table
  std::unique_ptr<torch::optim::Optimizer> adagrad;
  std::unique_ptr<DistributedOptimizer> allreduce;
  if (ps) {
    ps_worker =
        std::make_unique<ps::Worker>(head->named_parameters(), std::move(links), ps_options);
    embedding = std::make_unique<ps::Embedding>(table, *ps_worker, 0);
  } else {
    // Every rank starts from the same table (embedding_init is deterministic)
    // and the same MLP (seeded): nothing to broadcast.
    weight = ps::embedding_init(table, 0, o.rows).set_requires_grad(true);
    torch::OrderedDict<std::string, torch::Tensor> named = head->named_parameters();
    named.insert("table", weight);
    std::vector<torch::Tensor> params = head->parameters();
    params.push_back(weight);
    adagrad = make_adagrad(params);
    allreduce = std::make_unique<DistributedOptimizer>(*adagrad, named);
  }
  // The rows of `ids` (B, kFields) as (B, kFields, kDim).
  auto embed = [&](const torch::Tensor& ids) {
    if (ps) return embedding->forward(ids);
    return weight.index_select(0, ids.reshape({-1})).view({ids.size(0), kFields, kDim});
  };
  auto test_loss = [&]() {
    torch::NoGradGuard no_grad;
    return log_loss(head->forward(embed(test.ids)), test.y);
  };
  double initial_loss = -1;
  if (worker == 0) {
    if (ps) ps_worker->pull();  // step 0's parameters (pulled again by the first step)
    initial_loss = test_loss();
  }

  // Traffic of the training steps only: the initial evaluation's pulls are not in it.
  const ps::Worker::Stats dense_before = ps ? ps_worker->stats() : ps::Worker::Stats{};
  const ps::Embedding::Stats sparse_before = ps ? embedding->stats() : ps::Embedding::Stats{};
  nlohmann::json row = run_timed_steps(o.epochs, steps_per_epoch, o.batch, [&](int, int64_t s) {
    const torch::Tensor ids = train.ids.slice(0, s * o.batch, (s + 1) * o.batch);
    const torch::Tensor y = train.y.slice(0, s * o.batch, (s + 1) * o.batch);
    if (ps) {
      ps_worker->pull();
      head->zero_grad();
    } else {
      allreduce->zero_grad();
    }
    torch::binary_cross_entropy_with_logits(head->forward(embed(ids)), y).backward();
    if (ps) {
      embedding->push();
      ps_worker->push();
    } else {
      allreduce->step();
    }
  });
  const int64_t steps = row["steps"].get<int64_t>();
  if (ps) {
    // Per training step: taken before the evaluation's pulls below.
    const ps::Worker::Stats dense = ps_worker->stats();
    const ps::Embedding::Stats sparse = embedding->stats();
    const int64_t moved = dense.bytes_pulled + dense.bytes_pushed + sparse.bytes_pulled +
                          sparse.bytes_pushed - dense_before.bytes_pulled -
                          dense_before.bytes_pushed - sparse_before.bytes_pulled -
                          sparse_before.bytes_pushed;
    row["bytes_per_step"] = moved / std::max<int64_t>(1, steps);
    row["rows_per_step"] =
        (sparse.rows_pulled - sparse_before.rows_pulled) / std::max<int64_t>(1, steps);
    row["max_staleness_seen"] = dense.max_staleness_seen;
    ps_worker->pull();  // the parameters after every update this worker waited for
  } else {
    int64_t bytes = 0;
    for (const auto& p : adagrad->param_groups()[0].params()) bytes += p.numel() * p.element_size();
    // Ring allreduce: 2 (n - 1) / n of the gradients leave (and arrive at) each worker.
    row["bytes_per_step"] = static_cast<int64_t>(2.0 * (workers - 1) / workers * bytes);
    row["max_staleness_seen"] = 0;
  }
  if (worker == 0) {
    row["test_metric"] = test_loss();
    row["hidden_model_loss"] = log_loss(test.logit, test.y);
    row["initial_test_loss"] = initial_loss;
  }
  if (ps) ps_worker->finish();
  std::cout << row.dump() << std::endl;
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
