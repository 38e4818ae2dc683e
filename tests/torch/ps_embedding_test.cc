// Sparse embedding tables on the parameter server (kolo/torch/ps_embedding.h),
// ranks as threads: W workers and S servers on threads-backend links.
//  - a step pulls and pushes exactly the rows its batch names: rows read and
//    written on each server are counted, and every other row is untouched;
//  - sync mode equals one process with the whole batch and the same row-wise
//    optimizer written here independently (Adagrad and lazy Adam, several
//    steps, element-wise), with duplicate indices, across 1, 2 and 3 servers;
//  - duplicate indices pull a row once and sum its gradient;
//  - async applies every push as it comes; ssp keeps table pulls within the
//    staleness bound, with one worker made slow;
//  - indices out of range are a ContractError on every worker, naming the
//    index and the table's size, before anything reaches a server;
//  - an empty batch pulls and pushes nothing and the step still completes;
//  - a table that differs between worker and server, and a table push after
//    the step's dense push, are refused;
//  - server checkpoints hold the tables: resumed equals uninterrupted, bit
//    for bit (sync, Adagrad and Adam), and other tables are refused.
#include "kolo/torch/ps_embedding.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/parameter_server.h"
#include "temp_dir.h"
#include "thread_ranks.h"

namespace kolo::ps {
namespace {

constexpr std::chrono::milliseconds kTimeout{30000};
constexpr int64_t kDim = 4;

PsOptions options_of(Mode mode) {
  PsOptions o;
  o.mode = mode;
  o.timeout = kTimeout;
  return o;
}

EmbeddingOptions table_of(int64_t rows, SparseOptimizerOptions::Kind kind) {
  EmbeddingOptions t;
  t.name = "items";
  t.rows = rows;
  t.dim = kDim;
  t.init_scale = 0.5;
  t.seed = 7;
  t.optimizer.kind = kind;
  t.optimizer.lr = 0.1;
  t.optimizer.eps = kind == SparseOptimizerOptions::Kind::kAdam ? 1e-8 : 1e-10;
  return t;
}

// The dense part of the model: a linear head on the mean of the sample's
// embeddings (trained by the dense server with plain SGD).
torch::nn::Linear make_head() {
  torch::manual_seed(3);
  return torch::nn::Linear(kDim, 1);
}

constexpr double kHeadLr = 0.05;
OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(std::move(p), torch::optim::SGDOptions(kHeadLr));
  };
}

// loss = mean over samples of (head(mean_f e[b, f]) - y_b)^2.
torch::Tensor loss_of(torch::nn::Linear& head, const torch::Tensor& embedded,
                      const torch::Tensor& y) {
  return (head->forward(embedded.mean(1)).squeeze(1) - y).pow(2).mean();
}

struct Job {
  std::vector<std::shared_ptr<EmbeddingTable>> tables;  // per server
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<torch::nn::Linear> heads;  // per rank
};

using WorkFn = std::function<void(int worker, Worker& w, Embedding& e, torch::nn::Linear& head)>;

// Runs a W + S job as threads with one table: servers add `server_table`
// and serve; workers build an Embedding of `worker_table` and run `work`.
Job run_job(int workers, int num_servers, const EmbeddingOptions& server_table,
            const EmbeddingOptions& worker_table, const PsOptions& options, const WorkFn& work,
            std::vector<std::exception_ptr>* errors = nullptr) {
  Job job;
  std::vector<Links> links = make_thread_links(workers, num_servers, kTimeout);
  job.tables.resize(num_servers);
  job.servers.resize(num_servers);
  for (int r = 0; r < workers + num_servers; ++r) job.heads.push_back(make_head());
  auto rank_fn = [&](int rank) {
    torch::nn::Linear& head = job.heads[rank];
    if (rank >= workers) {
      const Roles roles = links[rank].roles;
      auto server = std::make_unique<Server>(head->named_parameters(), sgd(),
                                             std::move(links[rank]), options);
      auto table = std::make_shared<EmbeddingTable>(server_table, roles);
      server->add_table(table);
      job.tables[rank - workers] = table;
      server->run();
      job.servers[rank - workers] = std::move(server);
    } else {
      Worker w(head->named_parameters(), std::move(links[rank]), options);
      Embedding e(worker_table, w, 0);
      work(rank, w, e, head);
      w.finish();
    }
  };
  if (errors) {
    *errors = testing::run_ranks_catching(workers + num_servers, rank_fn);
  } else {
    testing::run_ranks(workers + num_servers, rank_fn);
  }
  return job;
}

// One ordinary step: pull, forward, backward, push (table first).
void step(Worker& w, Embedding& e, torch::nn::Linear& head, const torch::Tensor& ids,
          const torch::Tensor& y) {
  w.pull();
  head->zero_grad();
  loss_of(head, e.forward(ids), y).backward();
  e.push();
  w.push();
}

// The whole table as the servers hold it.
torch::Tensor assemble(const Job& job) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : job.tables) parts.push_back(t->weight());
  return torch::cat(parts);
}

TEST(PsEmbedding, PullAndPushTouchExactlyTheRowsNamed) {
  const EmbeddingOptions table = table_of(40, SparseOptimizerOptions::Kind::kAdagrad);
  // Worker 0 names rows of both servers' ranges (0..19 | 20..39), worker 1 others.
  const std::vector<std::vector<int64_t>> named = {{1, 5, 5, 21, 38}, {5, 7, 30, 30, 30}};
  Job job = run_job(
      2, 2, table, table, options_of(Mode::kSync),
      [&](int rank, Worker& w, Embedding& e, torch::nn::Linear& head) {
        const torch::Tensor ids = torch::tensor(named[rank], torch::kLong).view({1, -1});
        step(w, e, head, ids, torch::ones({1}));
        EXPECT_EQ(
            e.stats().rows_pulled,
            static_cast<int64_t>(std::set<int64_t>(named[rank].begin(), named[rank].end()).size()));
      });
  // Server 0 (rows 0..19) was asked for {1, 5, 21-} by worker 0 -> {1, 5} and
  // {5, 7} by worker 1: 4 rows read, the union {1, 5, 7} written once.
  EXPECT_EQ(job.tables[0]->stats().rows_read, 4);
  EXPECT_EQ(job.tables[0]->stats().rows_written, 3);
  EXPECT_EQ(job.tables[1]->stats().rows_read, 3);     // {21, 38} and {30}
  EXPECT_EQ(job.tables[1]->stats().rows_written, 3);  // {21, 30, 38}
  const std::set<int64_t> touched = {1, 5, 7, 21, 30, 38};
  const torch::Tensor initial = embedding_init(table, 0, table.rows);
  const torch::Tensor now = assemble(job);
  for (int64_t r = 0; r < table.rows; ++r) {
    if (touched.count(r)) {
      EXPECT_FALSE(torch::equal(now[r], initial[r])) << "row " << r << " was not updated";
    } else {
      EXPECT_TRUE(torch::equal(now[r], initial[r])) << "row " << r << " changed";
    }
  }
}

TEST(PsEmbedding, DuplicateIndicesPullOnceAndSumTheGradient) {
  const EmbeddingOptions table = table_of(10, SparseOptimizerOptions::Kind::kAdagrad);
  Job job =
      run_job(1, 1, table, table, options_of(Mode::kSync),
              [&](int, Worker& w, Embedding& e, torch::nn::Linear& head) {
                w.pull();
                const torch::Tensor out = e.forward(torch::tensor({5, 5, 5, 2}, torch::kLong));
                ASSERT_EQ(out.sizes(), (std::vector<int64_t>{4, kDim}));
                const torch::Tensor initial = embedding_init(table, 0, 10);
                EXPECT_TRUE(torch::equal(out[0], initial[5]));
                EXPECT_TRUE(torch::equal(out[2], initial[5]));
                EXPECT_TRUE(torch::equal(out[3], initial[2]));
                EXPECT_EQ(e.stats().rows_pulled, 2);
                // d(sum out * weights)/d row 5 = w0 + w1 + w2, row 2 = w3.
                const torch::Tensor weights = torch::arange(1, 5, torch::kFloat).view({4, 1});
                head->zero_grad();
                (out * weights).sum().backward();
                e.push();
                w.push();
              });
  // One Adagrad step from a zero accumulator moves each touched element by
  // -lr * g / (|g| + eps) = -lr * sign(g): row 5 and row 2 by -0.1, no other.
  const torch::Tensor initial = embedding_init(table, 0, 10);
  const torch::Tensor moved = assemble(job) - initial;
  EXPECT_TRUE(torch::allclose(moved[5], torch::full({kDim}, -0.1), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(moved[2], torch::full({kDim}, -0.1), 1e-5, 1e-6));
  EXPECT_EQ(job.tables[0]->stats().rows_written, 2);
  EXPECT_EQ(moved.ne(0).sum().item<int64_t>(), 2 * kDim);  // rows 2 and 5 only
}

// ---- sync equals one process with the whole batch ----

// The reference's row-wise optimizer, written from the formulas: Adagrad
// (acc += g^2; w -= lr g / (sqrt(acc) + eps)) and lazy Adam (m, v and the
// step count of a row advance only when the batch touches it).
struct ReferenceTable {
  EmbeddingOptions options;
  torch::Tensor weight, acc, m, v, steps;

  explicit ReferenceTable(const EmbeddingOptions& o) : options(o) {
    weight = embedding_init(o, 0, o.rows);
    acc = torch::zeros_like(weight);
    m = torch::zeros_like(weight);
    v = torch::zeros_like(weight);
    steps = torch::zeros({o.rows}, torch::kDouble);
  }

  void step(const torch::Tensor& grad, const torch::Tensor& touched_rows) {
    const SparseOptimizerOptions& o = options.optimizer;
    const auto* rows = touched_rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < touched_rows.numel(); ++i) {
      const int64_t r = rows[i];
      auto w = weight[r], g = grad[r];
      if (o.kind == SparseOptimizerOptions::Kind::kAdagrad) {
        acc[r] += g * g;
        w -= o.lr * g / (acc[r].sqrt() + o.eps);
      } else {
        steps[r] += 1;
        const double t = steps[r].item<double>();
        m[r] = o.beta1 * m[r] + (1 - o.beta1) * g;
        v[r] = o.beta2 * v[r] + (1 - o.beta2) * g * g;
        const double step_size =
            o.lr * std::sqrt(1 - std::pow(o.beta2, t)) / (1 - std::pow(o.beta1, t));
        w -= step_size * m[r] / (v[r].sqrt() + o.eps);
      }
    }
  }
};

struct SyncCase {
  SparseOptimizerOptions::Kind kind;
  int workers;
  int servers;
};

class PsEmbeddingSync : public ::testing::TestWithParam<SyncCase> {};

TEST_P(PsEmbeddingSync, EqualsOneProcessWithTheWholeBatch) {
  const SyncCase c = GetParam();
  constexpr int kSteps = 4;
  constexpr int64_t kBatch = 5, kFields = 3, kRows = 23;
  const EmbeddingOptions table = table_of(kRows, c.kind);
  // Batches of every step for the whole job: worker w takes samples
  // [w * kBatch, (w + 1) * kBatch). Indices from a small range: duplicates
  // within a sample, a worker and across workers.
  torch::manual_seed(19);
  std::vector<torch::Tensor> ids, ys;
  for (int s = 0; s < kSteps; ++s) {
    ids.push_back(torch::randint(0, kRows, {c.workers * kBatch, kFields}, torch::kLong));
    ys.push_back(torch::randn({c.workers * kBatch}));
  }

  Job job = run_job(c.workers, c.servers, table, table, options_of(Mode::kSync),
                    [&](int rank, Worker& w, Embedding& e, torch::nn::Linear& head) {
                      for (int s = 0; s < kSteps; ++s) {
                        step(w, e, head, ids[s].slice(0, rank * kBatch, (rank + 1) * kBatch),
                             ys[s].slice(0, rank * kBatch, (rank + 1) * kBatch));
                      }
                      w.pull();  // the final dense parameters, for the comparison below
                    });

  ReferenceTable reference(table);
  torch::nn::Linear head = make_head();
  for (int s = 0; s < kSteps; ++s) {
    const torch::Tensor weight = reference.weight.clone().set_requires_grad(true);
    head->zero_grad();
    loss_of(head, weight.index_select(0, ids[s].reshape({-1})).view({-1, kFields, kDim}), ys[s])
        .backward();
    torch::NoGradGuard no_grad;
    reference.step(weight.grad(), std::get<0>(torch::_unique2(ids[s].reshape({-1}))));
    for (auto& p : head->parameters()) p.sub_(kHeadLr * p.grad());
  }
  EXPECT_TRUE(torch::allclose(assemble(job), reference.weight, 1e-5, 1e-6))
      << "max difference " << (assemble(job) - reference.weight).abs().max().item<float>();
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_TRUE(torch::allclose(job.heads[w]->weight, head->weight, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(job.heads[w]->bias, head->bias, 1e-5, 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(, PsEmbeddingSync,
                         ::testing::Values(SyncCase{SparseOptimizerOptions::Kind::kAdagrad, 1, 1},
                                           SyncCase{SparseOptimizerOptions::Kind::kAdagrad, 2, 1},
                                           SyncCase{SparseOptimizerOptions::Kind::kAdagrad, 2, 2},
                                           SyncCase{SparseOptimizerOptions::Kind::kAdagrad, 3, 3},
                                           SyncCase{SparseOptimizerOptions::Kind::kAdam, 2, 2},
                                           SyncCase{SparseOptimizerOptions::Kind::kAdam, 3, 1}),
                         [](const auto& info) {
                           return std::string(info.param.kind == SparseOptimizerOptions::Kind::kAdam
                                                  ? "Adam"
                                                  : "Adagrad") +
                                  "_W" + std::to_string(info.param.workers) + "_S" +
                                  std::to_string(info.param.servers);
                         });

// ---- async ----

TEST(PsEmbedding, AsyncAppliesEveryPushAsItComes) {
  const EmbeddingOptions table = table_of(30, SparseOptimizerOptions::Kind::kAdagrad);
  constexpr int kSteps = 5;
  Job job = run_job(2, 2, table, table, options_of(Mode::kAsync),
                    [&](int rank, Worker& w, Embedding& e, torch::nn::Linear& head) {
                      // Server 0 holds rows 0..14, server 1 rows 15..29.
                      const torch::Tensor ids =
                          torch::tensor({rank * 15, rank * 15 + 1, rank * 15 + 2, 29}).view({1, 4});
                      for (int s = 0; s < kSteps; ++s) step(w, e, head, ids, torch::ones({1}));
                    });
  // Each push is its own update: 5 steps x 2 workers; server 1 holds 15..29.
  EXPECT_EQ(job.tables[0]->stats().updates, kSteps);  // worker 0's {0, 1, 2}
  EXPECT_EQ(job.tables[0]->stats().rows_written, kSteps * 3);
  EXPECT_EQ(job.tables[1]->stats().updates, 2 * kSteps);  // {29} and {15, 16, 17, 29}
  EXPECT_EQ(job.tables[1]->stats().rows_written, kSteps * (1 + 4));
}

TEST(PsEmbedding, SspBoundsTheStalenessOfTablePulls) {
  const EmbeddingOptions table = table_of(30, SparseOptimizerOptions::Kind::kAdagrad);
  constexpr int kSteps = 6;
  constexpr int kBound = 1;
  std::vector<Links> links = make_thread_links(2, 1, kTimeout);
  PsOptions options = options_of(Mode::kSsp);
  options.max_staleness = kBound;
  std::unique_ptr<Server> server;
  std::shared_ptr<EmbeddingTable> shard;
  std::vector<int64_t> seen(2, 0);
  testing::run_ranks(3, [&](int rank) {
    torch::nn::Linear head = make_head();
    if (rank == 2) {
      const Roles roles = links[rank].roles;
      auto s = std::make_unique<Server>(head->named_parameters(), sgd(), std::move(links[rank]),
                                        options);
      shard = std::make_shared<EmbeddingTable>(table, roles);
      s->add_table(shard);
      s->run();
      server = std::move(s);
      return;
    }
    Worker w(head->named_parameters(), std::move(links[rank]), options);
    Embedding e(table, w, 0);
    for (int s = 0; s < kSteps; ++s) {
      // Worker 1 is slow: worker 0 runs ahead until the bound holds it.
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      step(w, e, head, torch::tensor({{rank * 10, rank * 10 + 1}}), torch::ones({1}));
    }
    seen[rank] = w.stats().max_staleness_seen;
    w.finish();
  });
  EXPECT_LE(server->stats().staleness.max_staleness, kBound);
  EXPECT_LE(seen[0], kBound);
  EXPECT_EQ(shard->stats().updates, 2 * kSteps);  // every push applied as it came
  EXPECT_EQ(shard->stats().rows_written, 2 * 2 * kSteps);
}

// ---- errors ----

TEST(PsEmbedding, IndexOutOfRangeIsAContractErrorOnEveryWorker) {
  const EmbeddingOptions table = table_of(10, SparseOptimizerOptions::Kind::kAdagrad);
  const std::vector<int64_t> bad = {10, -1};
  std::vector<std::exception_ptr> errors;
  Job job = run_job(
      2, 1, table, table, options_of(Mode::kSync),
      [&](int rank, Worker& w, Embedding& e, torch::nn::Linear&) {
        w.pull();
        e.forward(torch::tensor({int64_t{3}, bad[rank], int64_t{4}}, torch::kLong));
      },
      &errors);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[rank]) << "worker " << rank;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const ContractError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("index " + std::to_string(bad[rank])), std::string::npos) << what;
      EXPECT_NE(what.find("table of 10 rows"), std::string::npos) << what;
      EXPECT_NE(what.find("'items'"), std::string::npos) << what;
    }
  }
  EXPECT_FALSE(errors[2]);  // the server saw the workers leave
  EXPECT_EQ(job.tables[0]->stats().rows_read, 0);
}

TEST(PsEmbedding, AnEmptyBatchPullsAndPushesNothing) {
  const EmbeddingOptions table = table_of(10, SparseOptimizerOptions::Kind::kAdagrad);
  constexpr int kSteps = 3;
  Job job = run_job(2, 1, table, table, options_of(Mode::kSync),
                    [&](int rank, Worker& w, Embedding& e, torch::nn::Linear& head) {
                      for (int s = 0; s < kSteps; ++s) {
                        if (rank == 0) {
                          w.pull();
                          const torch::Tensor out = e.forward(torch::empty({0, 3}, torch::kLong));
                          EXPECT_EQ(out.sizes(), (std::vector<int64_t>{0, 3, kDim}));
                          e.push();
                          w.push();  // no gradient: counts as zeros
                        } else {
                          step(w, e, head, torch::tensor({{4, 6}}), torch::ones({1}));
                        }
                      }
                      if (rank == 0) {
                        EXPECT_EQ(e.stats().rows_pulled, 0);
                      }
                    });
  EXPECT_EQ(job.servers[0]->stats().rounds, kSteps);
  EXPECT_EQ(job.tables[0]->stats().rows_read, kSteps * 2);
  EXPECT_EQ(job.tables[0]->stats().rows_written, kSteps * 2);
}

TEST(PsEmbedding, ATableThatDiffersIsRefused) {
  const EmbeddingOptions table = table_of(10, SparseOptimizerOptions::Kind::kAdagrad);
  EmbeddingOptions other = table;
  other.dim = kDim + 1;
  std::vector<std::exception_ptr> errors;
  run_job(
      1, 1, table, other, options_of(Mode::kAsync),
      [&](int, Worker& w, Embedding& e, torch::nn::Linear&) {
        w.pull();
        e.forward(torch::tensor({1}, torch::kLong));
      },
      &errors);
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no table 0"), std::string::npos) << e.what();
  }
}

TEST(PsEmbedding, PushAfterTheDensePushIsRefused) {
  const EmbeddingOptions table = table_of(10, SparseOptimizerOptions::Kind::kAdagrad);
  std::vector<std::exception_ptr> errors;
  run_job(
      1, 1, table, table, options_of(Mode::kAsync),
      [&](int, Worker& w, Embedding& e, torch::nn::Linear& head) {
        w.pull();
        head->zero_grad();
        loss_of(head, e.forward(torch::tensor({{1, 2}})), torch::ones({1})).backward();
        w.push();
        e.push();
      },
      &errors);
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("Embedding::push() first"), std::string::npos) << e.what();
  }
}

// Server checkpoints hold the tables: 2 workers and 2 servers train a table
// and the dense head in sync mode for 3 steps and save; a new job resuming
// from the save for 3 more steps ends bit for bit where 6 uninterrupted steps
// end: the rows, the row-wise optimizer state (Adagrad's accumulator; Adam's
// moments and per-row step counts) and the head. A job with other tables is
// refused naming them.
class PsEmbeddingCheckpoint : public ::testing::TestWithParam<SparseOptimizerOptions::Kind> {};

TEST_P(PsEmbeddingCheckpoint, ResumedEqualsUninterrupted) {
  constexpr int kSteps = 6, kSaveAt = 3;
  constexpr int64_t kBatch = 5, kFields = 3, kRows = 23;
  const EmbeddingOptions table = table_of(kRows, GetParam());
  torch::manual_seed(29);
  std::vector<torch::Tensor> ids, ys;
  for (int s = 0; s < kSteps; ++s) {
    ids.push_back(torch::randint(0, kRows, {2 * kBatch, kFields}, torch::kLong));
    ys.push_back(torch::randn({2 * kBatch}));
  }
  // Worker `rank` trains from its clock (the saved step when resumed) to `until`.
  auto train_until = [&](int until) {
    return [&, until](int rank, Worker& w, Embedding& e, torch::nn::Linear& head) {
      for (int64_t s = w.clock(); s < until; ++s) {
        step(w, e, head, ids[s].slice(0, rank * kBatch, (rank + 1) * kBatch),
             ys[s].slice(0, rank * kBatch, (rank + 1) * kBatch));
      }
      w.pull();  // the final dense parameters
    };
  };
  testing::TempDir dir("kolo-ps-embedding-checkpoint");
  const Job reference = run_job(2, 2, table, table, options_of(Mode::kSync), train_until(kSteps));
  PsOptions save = options_of(Mode::kSync);
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = kSaveAt;
  run_job(2, 2, table, table, save, train_until(kSaveAt));
  PsOptions resume = options_of(Mode::kSync);
  resume.resume_from = dir.path();
  const Job resumed = run_job(2, 2, table, table, resume, train_until(kSteps));

  EXPECT_TRUE(torch::equal(assemble(resumed), assemble(reference)))
      << "max difference " << (assemble(resumed) - assemble(reference)).abs().max().item<float>();
  for (int s = 0; s < 2; ++s) {
    const auto mine = resumed.tables[s]->state();
    const auto theirs = reference.tables[s]->state();
    ASSERT_EQ(mine.size(), theirs.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second))
          << "server " << s << " table state '" << mine[i].first << "'";
    }
  }
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(torch::equal(resumed.heads[w]->weight, reference.heads[w]->weight));
    EXPECT_TRUE(torch::equal(resumed.heads[w]->bias, reference.heads[w]->bias));
  }

  // Another table (another name) on the servers: refused, naming both.
  EmbeddingOptions other = table;
  other.name = "users";
  std::vector<std::exception_ptr> errors;
  run_job(1, 2, other, other, resume, train_until(kSteps), &errors);
  ASSERT_TRUE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const ContractError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("ps-shard-0-of-2-step-"), std::string::npos) << text;
    EXPECT_NE(text.find("'items'"), std::string::npos) << text;
    EXPECT_NE(text.find("'users'"), std::string::npos) << text;
  }
  EXPECT_TRUE(errors[0]) << "the worker got the servers' error, not a hang";
}

INSTANTIATE_TEST_SUITE_P(
    , PsEmbeddingCheckpoint,
    ::testing::Values(SparseOptimizerOptions::Kind::kAdagrad, SparseOptimizerOptions::Kind::kAdam),
    [](const auto& info) {
      return std::string(info.param == SparseOptimizerOptions::Kind::kAdam ? "Adam" : "Adagrad");
    });

}  // namespace
}  // namespace kolo::ps
