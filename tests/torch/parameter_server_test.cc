// The parameter server (kolo/torch/parameter_server.h), ranks as threads:
// W workers and S servers, each pair on its own threads-backend link.
//  - sync mode equals DistributedOptimizer (and one process with the whole
//    batch) after several SGD-with-momentum and Adam steps, with the model's
//    tensors cut into slices across 1, 2 and 3 servers;
//  - async mode converges on a small regression;
//  - bounded staleness: no update is computed more than max_staleness steps
//    ahead of the slowest worker, with one worker made slow;
//  - mismatched models or modes are refused; a worker that dies does not stop
//    an async server, which never waits for it to come back once the others
//    are done; a dead worker restarted over new links rejoins an async or ssp
//    job and its updates resume (a sync job refuses it); a server that is
//    gone is a RuntimeFault naming it; a frozen worker that holds pulls back
//    is evicted (ssp goes on without it, sync stops naming it).
#include "kolo/torch/parameter_server.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "thread_ranks.h"

namespace kolo::ps {
namespace {

namespace ot = kolo::optimizer_testing;
using ot::Batch;
using ot::Mlp;
using ot::OptimizerKind;

constexpr std::chrono::milliseconds kTimeout{30000};
constexpr int kSteps = 4;
constexpr int64_t kBatch = 6;

PsOptions options_of(Mode mode, int max_staleness = 0) {
  PsOptions o;
  o.mode = mode;
  o.max_staleness = max_staleness;
  o.timeout = kTimeout;
  return o;
}

OptimizerFactory factory_of(OptimizerKind kind, double lr) {
  return [kind, lr](std::vector<torch::Tensor> params) {
    return ot::make_optimizer(kind, std::move(params), lr);
  };
}

// Runs a W + S job as threads: servers serve (their Server is kept in
// `servers`), workers run `work` and finish.
void run_job(int workers, int num_servers, const std::vector<std::shared_ptr<Mlp>>& models,
             const OptimizerFactory& factory, const PsOptions& options,
             const std::function<void(int worker, Worker& w, Mlp& model)>& work,
             std::vector<std::unique_ptr<Server>>* servers = nullptr) {
  std::vector<Links> links = make_thread_links(workers, num_servers, kTimeout);
  std::vector<std::unique_ptr<Server>> kept(num_servers);
  testing::run_ranks(workers + num_servers, [&](int rank) {
    Mlp& model = *models[rank];
    if (rank >= workers) {
      auto server = std::make_unique<Server>(model.named_parameters(), factory,
                                             std::move(links[rank]), options);
      server->run();
      kept[rank - workers] = std::move(server);
    } else {
      Worker w(model.named_parameters(), std::move(links[rank]), options);
      work(rank, w, model);
      w.finish();
    }
  });
  if (servers) *servers = std::move(kept);
}

// Every rank starts from `initial` (the servers' copies are what counts).
std::vector<std::shared_ptr<Mlp>> copies(const Mlp& initial, int n) {
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < n; ++r) models.push_back(ot::clone_of(initial));
  return models;
}

// DistributedOptimizer on `world` rank-threads, each with rows block r of every batch.
std::shared_ptr<Mlp> train_distributed(const Mlp& initial, const std::vector<Batch>& batches,
                                       int world, OptimizerKind kind, double lr) {
  testing::EngineWorld engines("threads", world);
  auto models = copies(initial, world);
  testing::run_ranks(world, [&](int rank) {
    auto engine = engines.engine(rank);
    Mlp& model = *models[rank];
    auto optimizer = ot::make_optimizer(kind, model.parameters(), lr);
    DistributedOptimizerOptions options;
    options.engine = engine.get();
    options.timeout = testing::kEngineTimeout;
    DistributedOptimizer distributed(*optimizer, model.named_parameters(), options);
    for (const Batch& batch : batches) {
      distributed.zero_grad();
      ot::loss_of(model, batch.rows(rank, kBatch, batch.x), batch.rows(rank, kBatch, batch.y))
          .backward();
      distributed.step();
    }
    ot::finish(*engine);
  });
  return models[0];
}

// The model as the servers hold it after training, assembled from their shards.
void gather_servers(const std::vector<std::unique_ptr<Server>>& servers, Mlp& into) {
  torch::NoGradGuard no_grad;
  auto params = into.parameters();
  for (const auto& server : servers) {
    auto shard = server->shard();
    const auto& slices = server->slices();
    for (size_t i = 0; i < slices.size(); ++i) {
      params[slices[i].variable]
          .view({-1})
          .slice(0, slices[i].begin, slices[i].end)
          .copy_(shard[i]);
    }
  }
}

struct SyncCase {
  OptimizerKind kind;
  int workers;
  int servers;
};

class PsSyncEquivalence : public ::testing::TestWithParam<SyncCase> {};

TEST_P(PsSyncEquivalence, EqualsDistributedOptimizer) {
  const SyncCase c = GetParam();
  const double lr = c.kind == OptimizerKind::kSgd ? 0.05 : 0.01;
  torch::manual_seed(11);
  Mlp initial;
  const std::vector<Batch> batches = ot::make_batches(kSteps, c.workers * kBatch);
  auto reference = train_distributed(initial, batches, c.workers, c.kind, lr);

  auto models = copies(initial, c.workers + c.servers);
  std::vector<std::unique_ptr<Server>> servers;
  run_job(
      c.workers, c.servers, models, factory_of(c.kind, lr), options_of(Mode::kSync),
      [&](int worker, Worker& w, Mlp& model) {
        for (const Batch& batch : batches) {
          w.pull();
          model.zero_grad();
          ot::loss_of(model, batch.rows(worker, kBatch, batch.x),
                      batch.rows(worker, kBatch, batch.y))
              .backward();
          w.push();
        }
        w.pull();  // the parameters after the last step
        EXPECT_EQ(w.stats().max_staleness_seen, 0);
      },
      &servers);
  for (int r = 0; r < c.workers; ++r) {
    ot::expect_params_close(*models[r], *reference, 1e-5, 1e-6,
                            "worker " + std::to_string(r) + " vs DistributedOptimizer");
  }
  Mlp assembled;
  gather_servers(servers, assembled);
  ot::expect_params_close(assembled, *reference, 1e-5, 1e-6, "servers vs DistributedOptimizer");
  for (const auto& server : servers) {
    EXPECT_EQ(server->stats().rounds, kSteps);
    EXPECT_EQ(server->stats().staleness.updates, kSteps * c.workers);
    EXPECT_TRUE(server->stats().lost.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(, PsSyncEquivalence,
                         ::testing::Values(SyncCase{OptimizerKind::kSgd, 2, 1},
                                           SyncCase{OptimizerKind::kSgd, 3, 2},
                                           SyncCase{OptimizerKind::kAdam, 2, 2},
                                           SyncCase{OptimizerKind::kAdam, 2, 3}));

// y = x . w_true on 8 features; each worker its own rows.
struct Regression : torch::nn::Module {
  Regression() { fc = register_module("fc", torch::nn::Linear(8, 1)); }
  torch::nn::Linear fc{nullptr};
};

TEST(PsAsync, ConvergesOnARegression) {
  constexpr int kWorkers = 3, kServers = 2, kAsyncSteps = 150;
  torch::manual_seed(5);
  const torch::Tensor w_true = torch::randn({8, 1});
  std::vector<torch::Tensor> xs, ys;
  for (int r = 0; r < kWorkers; ++r) {
    xs.push_back(torch::randn({64, 8}));
    ys.push_back(xs.back().mm(w_true) + 0.5);
  }
  std::vector<std::shared_ptr<Regression>> models;
  for (int r = 0; r < kWorkers + kServers; ++r) models.push_back(std::make_shared<Regression>());
  {
    torch::NoGradGuard no_grad;
    for (auto& m : models) {
      for (auto& p : m->parameters()) p.zero_();
    }
  }
  const torch::Tensor all_x = torch::cat(xs), all_y = torch::cat(ys);
  const double initial_loss = torch::mse_loss(models[0]->fc(all_x), all_y).item<double>();

  std::vector<Links> links = make_thread_links(kWorkers, kServers, kTimeout);
  std::vector<std::unique_ptr<Server>> servers(kServers);
  const PsOptions options = options_of(Mode::kAsync);
  testing::run_ranks(kWorkers + kServers, [&](int rank) {
    Regression& model = *models[rank];
    if (rank >= kWorkers) {
      servers[rank - kWorkers] =
          std::make_unique<Server>(model.named_parameters(), factory_of(OptimizerKind::kSgd, 0.02),
                                   std::move(links[rank]), options);
      servers[rank - kWorkers]->run();
      return;
    }
    Worker w(model.named_parameters(), std::move(links[rank]), options);
    for (int step = 0; step < kAsyncSteps; ++step) {
      w.pull();
      model.zero_grad();
      torch::mse_loss(model.fc(xs[rank]), ys[rank]).backward();
      w.push();
    }
    w.pull();
    w.finish();
  });
  const double final_loss = torch::mse_loss(models[0]->fc(all_x), all_y).item<double>();
  EXPECT_LT(final_loss, 1e-2 * initial_loss)
      << "initial " << initial_loss << ", after " << kAsyncSteps << " async steps per worker "
      << final_loss;
  for (const auto& s : servers) EXPECT_EQ(s->stats().staleness.updates, kWorkers * kAsyncSteps);
}

TEST(PsSsp, StalenessNeverExceedsTheBound) {
  constexpr int kWorkers = 3, kServers = 2, kSspSteps = 25;
  for (int bound : {0, 2}) {
    torch::manual_seed(3);
    Mlp initial;
    auto models = copies(initial, kWorkers + kServers);
    const std::vector<Batch> batches = ot::make_batches(1, kBatch);
    std::vector<int64_t> seen(kWorkers, -1);
    std::vector<std::unique_ptr<Server>> servers;
    run_job(
        kWorkers, kServers, models, factory_of(OptimizerKind::kSgd, 0.01),
        options_of(Mode::kSsp, bound),
        [&](int worker, Worker& w, Mlp& model) {
          for (int step = 0; step < kSspSteps; ++step) {
            w.pull();
            model.zero_grad();
            ot::loss_of(model, batches[0].x, batches[0].y).backward();
            // Worker 0 is slow: the others would run far ahead without the bound.
            if (worker == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            w.push();
          }
          seen[worker] = w.stats().max_staleness_seen;
        },
        &servers);
    for (int r = 0; r < kWorkers; ++r) EXPECT_LE(seen[r], bound) << "worker " << r;
    for (const auto& s : servers) {
      const StalenessStats st = s->stats().staleness;
      EXPECT_LE(st.max_staleness, bound);
      EXPECT_EQ(st.updates, kWorkers * kSspSteps);
      int64_t counted = 0;
      for (size_t k = 0; k < st.counts.size(); ++k) {
        counted += st.counts[k];
        if (static_cast<int64_t>(k) > bound) {
          EXPECT_EQ(st.counts[k], 0) << "staleness " << k;
        }
      }
      EXPECT_EQ(counted, st.updates);
    }
  }
}

TEST(PsErrors, MismatchedModeIsRefusedOnTheWorker) {
  torch::manual_seed(1);
  Mlp initial;
  auto models = copies(initial, 2);
  std::vector<Links> links = make_thread_links(1, 1, kTimeout);
  auto errors = testing::run_ranks_catching(2, [&](int rank) {
    if (rank == 1) {
      Server server(models[1]->named_parameters(), factory_of(OptimizerKind::kSgd, 0.1),
                    std::move(links[1]), options_of(Mode::kAsync));
      server.run();
      ASSERT_EQ(server.stats().lost.size(), 1u);
      EXPECT_NE(server.stats().lost[0].find("mode"), std::string::npos) << server.stats().lost[0];
    } else {
      Worker w(models[0]->named_parameters(), std::move(links[0]), options_of(Mode::kSsp, 1));
    }
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("ssp (max_staleness 1)"), std::string::npos) << e.what();
  }
}

TEST(PsErrors, MismatchedModelIsRefused) {
  torch::manual_seed(1);
  Mlp a;
  Regression b;
  std::vector<Links> links = make_thread_links(1, 1, kTimeout);
  auto errors = testing::run_ranks_catching(2, [&](int rank) {
    if (rank == 1) {
      Server server(b.named_parameters(), factory_of(OptimizerKind::kSgd, 0.1), std::move(links[1]),
                    options_of(Mode::kAsync));
      server.run();
    } else {
      Worker w(a.named_parameters(), std::move(links[0]), options_of(Mode::kAsync));
    }
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), ContractError);
  EXPECT_FALSE(errors[1]) << "an async server outlives a refused worker";
}

// Worker 1 vanishes (its links are destroyed, as a dead process's are) after
// two steps; the async server goes on with worker 0 and records the loss.
// The server can take restarted workers (a rejoin channel), but none comes:
// it ends when worker 0 is done instead of waiting for worker 1.
TEST(PsFaults, AsyncServerOutlivesADeadWorker) {
  torch::manual_seed(2);
  Mlp initial;
  auto models = copies(initial, 3);
  const std::vector<Batch> batches = ot::make_batches(1, kBatch);
  std::vector<Links> links = make_thread_links(2, 1, kTimeout);
  std::atomic<int> asked{0};
  links[2].rejoin = std::make_shared<RejoinChannel>();
  links[2].rejoin->announced = [&asked](int) {
    asked += 1;
    return int64_t{0};
  };
  links[2].rejoin->accept = [](int, int64_t) -> std::unique_ptr<Communicator> {
    throw std::logic_error("no worker announced a restart");
  };
  links[2].rejoin->close = [] {};
  std::unique_ptr<Server> server;
  const PsOptions options = options_of(Mode::kAsync);
  std::atomic<bool> died{false};
  testing::run_ranks(3, [&](int rank) {
    Mlp& model = *models[rank];
    if (rank == 2) {
      server =
          std::make_unique<Server>(model.named_parameters(), factory_of(OptimizerKind::kSgd, 0.01),
                                   std::move(links[2]), options);
      server->run();
      return;
    }
    std::vector<Communicator*> own;
    for (auto& peer : links[rank].peers) own.push_back(peer.get());
    auto w = std::make_unique<Worker>(model.named_parameters(), std::move(links[rank]), options);
    const int steps = rank == 1 ? 2 : 20;
    for (int step = 0; step < steps; ++step) {
      w->pull();
      model.zero_grad();
      ot::loss_of(model, batches[0].x, batches[0].y).backward();
      w->push();
      if (rank == 0 && step == 10) {
        while (!died) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (rank == 1) {
      // Die: no finish(); the links break as a dead process's do.
      for (Communicator* link : own) link->abort("worker 1 dies", {});
      died = true;
      return;
    }
    w->finish();
  });
  const Server::Stats stats = server->stats();
  EXPECT_EQ(stats.staleness.updates, 22);
  EXPECT_EQ(stats.staleness.worker_updates, (std::vector<int64_t>{20, 2}));
  EXPECT_EQ(stats.staleness.rejoins, (std::vector<int64_t>{0, 0}));
  ASSERT_EQ(stats.lost.size(), 1u);
  EXPECT_NE(stats.lost[0].find("worker 1"), std::string::npos) << stats.lost[0];
}

// Worker 1 dies after kBefore steps, as above, and comes back as its restart
// 1 over new links (the channel kolo::ps::connect() builds from the store,
// made here by hand for threads) with a fresh model: it continues from the
// slowest live worker's step on every server alike, pulls the current
// parameters and pushes kAfter more, while worker 0 trains on until then.
// Parameter: max_staleness for ssp, -1 for async.
class PsRejoin : public ::testing::TestWithParam<int> {};

TEST_P(PsRejoin, ADeadWorkerRejoinsAndItsUpdatesResume) {
  constexpr int kWorkers = 2, kServers = 2, kBefore = 5, kAfter = 5;
  const PsOptions options =
      GetParam() < 0 ? options_of(Mode::kAsync) : options_of(Mode::kSsp, GetParam());
  torch::manual_seed(4);
  Mlp initial;
  auto models = copies(initial, kWorkers + kServers + 1);  // the last: the restarted worker's
  const std::vector<Batch> batches = ot::make_batches(1, kBatch);
  std::vector<Links> links = make_thread_links(kWorkers, kServers, kTimeout);
  // Restart 1 of worker 1: a new pair per server.
  std::vector<std::vector<std::unique_ptr<Communicator>>> pairs;
  for (int s = 0; s < kServers; ++s) pairs.push_back(make_thread_communicators(2, kTimeout));
  std::atomic<int64_t> announced{0};
  for (int s = 0; s < kServers; ++s) {
    auto channel = std::make_shared<RejoinChannel>();
    channel->announced = [&announced](int worker) { return worker == 1 ? announced.load() : 0; };
    channel->accept = [&pairs, s](int worker, int64_t generation) {
      EXPECT_EQ(worker, 1);
      EXPECT_EQ(generation, 1);
      return std::move(pairs[s][kServerPeer]);
    };
    channel->close = [] {};
    links[kWorkers + s].rejoin = channel;
  }
  std::vector<std::unique_ptr<Server>> servers(kServers);
  std::atomic<bool> back_and_done{false};
  int64_t continued_at = -1;
  auto step = [&](Worker& w, Mlp& model) {
    w.pull();
    model.zero_grad();
    ot::loss_of(model, batches[0].x, batches[0].y).backward();
    w.push();
  };
  testing::run_ranks(kWorkers + kServers, [&](int rank) {
    if (rank >= kWorkers) {
      auto server = std::make_unique<Server>(models[rank]->named_parameters(),
                                             factory_of(OptimizerKind::kSgd, 0.01),
                                             std::move(links[rank]), options);
      server->run();
      servers[rank - kWorkers] = std::move(server);
      return;
    }
    if (rank == 0) {
      Worker w(models[0]->named_parameters(), std::move(links[0]), options);
      const auto deadline = std::chrono::steady_clock::now() + kTimeout;
      while (!back_and_done && std::chrono::steady_clock::now() < deadline) step(w, *models[0]);
      EXPECT_TRUE(back_and_done) << "worker 1 never came back";
      w.finish();
      return;
    }
    {
      std::vector<Communicator*> own;
      for (auto& peer : links[1].peers) own.push_back(peer.get());
      Worker w(models[1]->named_parameters(), std::move(links[1]), options);
      for (int i = 0; i < kBefore; ++i) step(w, *models[1]);
      w.pull();  // answered after every push above was applied
      for (Communicator* link : own) link->abort("worker 1 dies", {});
    }
    Links again;
    again.roles = Roles{kWorkers, kServers, 1};
    again.generation = 1;
    for (int s = 0; s < kServers; ++s) again.peers.push_back(std::move(pairs[s][kWorkerPeer]));
    announced = 1;
    Mlp& fresh = *models[kWorkers + kServers];
    Worker w(fresh.named_parameters(), std::move(again), options);
    continued_at = w.clock();
    for (int i = 0; i < kAfter; ++i) step(w, fresh);
    back_and_done = true;
    w.finish();
  });
  EXPECT_GE(continued_at, 0);
  for (int s = 0; s < kServers; ++s) {
    const Server::Stats stats = servers[s]->stats();
    EXPECT_EQ(stats.staleness.rejoins, (std::vector<int64_t>{0, 1})) << "server " << s;
    EXPECT_EQ(stats.staleness.worker_updates[1], kBefore + kAfter) << "server " << s;
    EXPECT_GE(stats.staleness.worker_updates[0], 1) << "server " << s;
    ASSERT_EQ(stats.lost.size(), 1u) << "server " << s;
    EXPECT_NE(stats.lost[0].find("worker 1"), std::string::npos) << stats.lost[0];
    if (GetParam() >= 0) {
      EXPECT_LE(stats.staleness.max_staleness, GetParam()) << "server " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AsyncAndSsp, PsRejoin, ::testing::Values(-1, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param < 0 ? std::string("async") : std::string("ssp1");
                         });

// A restarted worker's hello reaches a sync server: refused on both sides
// (a sync job stops when a worker dies, so it has nothing to rejoin).
TEST(PsErrors, ASyncServerRefusesARestartedWorker) {
  torch::manual_seed(1);
  Mlp model;
  std::vector<Links> links = make_thread_links(1, 1, kTimeout);
  links[0].generation = 1;
  std::unique_ptr<Server> server;
  auto errors = testing::run_ranks_catching(2, [&](int rank) {
    if (rank == 1) {
      server =
          std::make_unique<Server>(model.named_parameters(), factory_of(OptimizerKind::kSgd, 0.1),
                                   std::move(links[1]), options_of(Mode::kSync));
      server->run();
    } else {
      Worker w(model.named_parameters(), std::move(links[0]), options_of(Mode::kSync));
    }
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("runs mode sync"), std::string::npos) << e.what();
  }
}

TEST(PsFaults, AGoneServerIsARuntimeFaultNamingIt) {
  torch::manual_seed(1);
  Mlp model;
  std::vector<Links> links = make_thread_links(1, 2, kTimeout);
  links[2].peers.clear();  // server 1 (world rank 2) is gone before the worker greets it
  std::unique_ptr<Server> server0;
  auto errors = testing::run_ranks_catching(2, [&](int rank) {
    if (rank == 1) {
      server0 =
          std::make_unique<Server>(model.named_parameters(), factory_of(OptimizerKind::kSgd, 0.1),
                                   std::move(links[1]), options_of(Mode::kAsync));
      server0->run();
    } else {
      Worker w(model.named_parameters(), std::move(links[0]), options_of(Mode::kAsync));
    }
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    FAIL() << "a timeout, not the fault: " << e.what();
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("parameter server 1 (world rank 2) is gone"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.failed_ranks(), std::vector<int>{2});
  }
}

// A frozen worker (a SIGSTOPped process: alive, silent) holds the others'
// ssp pulls back. Each server evicts it once it has sent nothing for
// evict_after, asks the launcher to stop it (its generation 0) and goes on:
// worker 0 finishes its steps long before its own pull timeout, and the
// frozen worker, woken afterwards, finds its links aborted naming the
// eviction.
TEST(PsFaults, AFrozenSspWorkerIsEvictedAndTheOthersGoOn) {
  constexpr int kWorkers = 2, kServers = 2, kSteps0 = 10;
  PsOptions options = options_of(Mode::kSsp, 1);
  options.evict_after = std::chrono::milliseconds(500);
  torch::manual_seed(5);
  Mlp initial;
  auto models = copies(initial, kWorkers + kServers);
  const std::vector<Batch> batches = ot::make_batches(1, kBatch);
  std::vector<Links> links = make_thread_links(kWorkers, kServers, kTimeout);
  struct Asked {
    int worker;
    int64_t generation;
    std::string why;
  };
  std::mutex asked_mutex;
  std::vector<Asked> asked;
  for (int s = 0; s < kServers; ++s) {
    auto channel = std::make_shared<RejoinChannel>();
    channel->announced = [](int) { return int64_t{0}; };
    channel->accept = [](int, int64_t) -> std::unique_ptr<Communicator> {
      throw std::logic_error("no worker announced a restart");
    };
    channel->close = [] {};
    channel->evict = [&](int worker, int64_t generation, const std::string& why) {
      std::lock_guard<std::mutex> lock(asked_mutex);
      asked.push_back({worker, generation, why});
      return true;
    };
    links[kWorkers + s].rejoin = channel;
  }
  std::vector<std::unique_ptr<Server>> servers(kServers);
  std::atomic<bool> worker0_done{false};
  double worker0_seconds = 0;
  std::string woken_error;
  auto step = [&](Worker& w, Mlp& model) {
    w.pull();
    model.zero_grad();
    ot::loss_of(model, batches[0].x, batches[0].y).backward();
    w.push();
  };
  testing::run_ranks(kWorkers + kServers, [&](int rank) {
    if (rank >= kWorkers) {
      auto server = std::make_unique<Server>(models[rank]->named_parameters(),
                                             factory_of(OptimizerKind::kSgd, 0.01),
                                             std::move(links[rank]), options);
      server->run();
      servers[rank - kWorkers] = std::move(server);
      return;
    }
    Worker w(models[rank]->named_parameters(), std::move(links[rank]), options);
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps0; ++i) step(w, *models[0]);
      worker0_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      w.finish();
      worker0_done = true;
      return;
    }
    step(w, *models[1]);
    // Frozen: alive, holding its links, sending nothing.
    while (!worker0_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    try {
      step(w, *models[1]);
    } catch (const RuntimeFault& e) {
      woken_error = e.what();
    }
  });
  EXPECT_LT(worker0_seconds, 10.0) << "worker 0 waited for the frozen worker";
  EXPECT_NE(woken_error.find("evicted worker 1"), std::string::npos) << woken_error;
  ASSERT_EQ(asked.size(), static_cast<size_t>(kServers));
  for (const Asked& a : asked) {
    EXPECT_EQ(a.worker, 1);
    EXPECT_EQ(a.generation, 0);
    EXPECT_NE(a.why.find("evicted it: it sent nothing for"), std::string::npos) << a.why;
    EXPECT_NE(a.why.find("while worker 0's pull for step"), std::string::npos) << a.why;
  }
  for (int s = 0; s < kServers; ++s) {
    const Server::Stats stats = servers[s]->stats();
    EXPECT_EQ(stats.staleness.worker_updates, (std::vector<int64_t>{kSteps0, 1})) << s;
    EXPECT_LE(stats.staleness.max_staleness, 1) << s;
    ASSERT_EQ(stats.lost.size(), 1u) << s;
    EXPECT_NE(stats.lost[0].find("worker 1: evicted: it sent nothing"), std::string::npos)
        << stats.lost[0];
  }
}

// In sync mode every step needs every worker: the frozen worker's eviction
// stops the job, and the waiting worker's pull fails at once with a
// RuntimeFault naming the frozen worker, not a timeout naming the server.
TEST(PsFaults, AFrozenSyncWorkerStopsTheJobNamingIt) {
  PsOptions options = options_of(Mode::kSync);
  options.evict_after = std::chrono::milliseconds(500);
  torch::manual_seed(6);
  Mlp initial;
  auto models = copies(initial, 3);
  const std::vector<Batch> batches = ot::make_batches(1, kBatch);
  std::vector<Links> links = make_thread_links(2, 1, kTimeout);
  std::atomic<bool> worker0_failed{false};
  auto errors = testing::run_ranks_catching(3, [&](int rank) {
    if (rank == 2) {
      Server server(models[2]->named_parameters(), factory_of(OptimizerKind::kSgd, 0.01),
                    std::move(links[2]), options);
      server.run();
      return;
    }
    Worker w(models[rank]->named_parameters(), std::move(links[rank]), options);
    if (rank == 1) {
      w.pull();
      while (!worker0_failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 5; ++i) {
        w.pull();
        models[0]->zero_grad();
        ot::loss_of(*models[0], batches[0].x, batches[0].y).backward();
        w.push();
      }
    } catch (...) {
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                10.0);
      worker0_failed = true;
      throw;
    }
    worker0_failed = true;
  });
  ASSERT_TRUE(errors[0]) << "worker 0 trained on without the frozen worker in sync mode";
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    FAIL() << "a timeout, not the eviction: " << e.what();
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("(mode sync) lost worker 1 (world rank 1): evicted: it "
                                         "sent nothing for"),
              std::string::npos)
        << e.what();
  }
  ASSERT_TRUE(errors[2]) << "the sync server did not stop";
}

}  // namespace
}  // namespace kolo::ps
