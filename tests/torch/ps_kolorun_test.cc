// The parameter server as real processes: run by tests/integration/ps_fault_test.cc as
// `kolorun -np 2 --servers 1 [--restart-workers 1] kolo_torch_tests
// --gtest_filter=PsUnderKolorun.<one>` (skipped when not launched with servers). Every process runs
// the test in its role; the integration test checks what each of them printed.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "kolo/torch/parameter_server.h"
#include "optimizer_harness.h"

namespace kolo::ps {
namespace {

namespace ot = kolo::optimizer_testing;

bool launched_with_servers() { return std::getenv("KOLO_PS_SERVERS") != nullptr; }

// The async options and the servers' optimizer of both tests.
PsOptions async_options() {
  PsOptions options;
  options.mode = Mode::kAsync;
  options.timeout = std::chrono::seconds(60);  // far beyond how long a fault takes
  return options;
}

// One step of a worker: pull, the gradient of `batch`, push.
void train_step(Worker& worker, ot::Mlp& model, const ot::Batch& batch) {
  worker.pull();
  model.zero_grad();
  ot::loss_of(model, batch.x, batch.y).backward();
  worker.push();
}

// The healthy worker of the restart tests: steps until the restarted worker
// sets `done_key` in the store (at most `limit`), then finishes and shuts down.
void train_until_done(Worker& worker, const std::function<void()>& step, Store& store,
                      const std::string& done_key, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!store.check({done_key}) && std::chrono::steady_clock::now() < deadline) step();
  EXPECT_TRUE(store.check({done_key})) << "the restarted worker never finished";
  worker.finish();
  shutdown();
}

OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> p) {
    return ot::make_optimizer(ot::OptimizerKind::kSgd, std::move(p), 0.05);
  };
}

// Server 0 dies by SIGKILL in the middle of asynchronous training (after
// 40 updates, while the workers keep pulling and pushing). Each worker must
// end with a RuntimeFault naming the server's world rank, not a timeout or a
// hang, and prints it. kolorun stops the other ranks as soon as one dies;
// here they ignore its SIGTERM (until its SIGKILL after --grace), so that
// what every worker reports on its own (as it would under mpirun or srun)
// is what the test sees.
TEST(PsUnderKolorun, AKilledServerIsAnErrorOnEveryWorker) {
  if (!launched_with_servers()) GTEST_SKIP() << "run by tests/integration/ps_fault_test.cc";
  signal(SIGTERM, SIG_IGN);
  init();
  torch::manual_seed(3);
  ot::Mlp model;
  Links links = connect(runtime());
  const Roles roles = links.roles;
  const PsOptions options = async_options();
  if (roles.is_server()) {
    Server server(model.named_parameters(), sgd(), std::move(links), options);
    std::atomic<bool> done{false};
    std::thread killer([&] {
      while (!done && server.stats().staleness.updates < 40) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (!done && roles.server_index() == 0) raise(SIGKILL);
    });
    try {
      server.run();
    } catch (...) {
    }
    done = true;
    killer.join();
    ADD_FAILURE() << "server " << roles.server_index() << " outlived the training";
    return;
  }
  Worker worker(model.named_parameters(), std::move(links), options);
  const std::string expected =
      "parameter server 0 (world rank " + std::to_string(roles.server_rank(0)) + ") is gone";
  try {
    for (int step = 0; step < 100000; ++step) {
      const ot::Batch batch = ot::make_batches(1, 8)[0];
      worker.pull();
      model.zero_grad();
      ot::loss_of(model, batch.x, batch.y).backward();
      worker.push();
    }
    ADD_FAILURE() << "worker " << roles.worker_index() << " never saw the server die";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "a timeout, not the fault: " << e.what();
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    EXPECT_EQ(e.failed_ranks(), std::vector<int>{roles.server_rank(0)});
    std::printf("ps under kolorun: worker %d at step %lld: %s\n", roles.worker_index(),
                static_cast<long long>(worker.clock()), e.what());
    std::fflush(stdout);
  }
  // The job is broken: no kolo::shutdown() (its engine's world has a dead rank).
}

// Run as `kolorun -np 2 --servers 1 --restart-workers 1`: worker 1 SIGKILLs
// itself in the middle of asynchronous training, after kBefore steps (and a
// pull, so the server has applied all of them); kolorun restarts it with
// KOLO_PS_REJOIN=1, and the new process rejoins the running server (its
// kolo::init() builds no world), continues from the slowest live worker's
// step and pushes kAfter more. Worker 0 trains until the store says the
// restarted worker is done. The server's per-worker counts show worker 1's
// updates resumed.
TEST(PsUnderKolorun, AKilledWorkerRejoinsTheAsyncJob) {
  if (!launched_with_servers()) GTEST_SKIP() << "run by tests/integration/ps_fault_test.cc";
  constexpr int kBefore = 20, kAfter = 20;
  init();
  torch::manual_seed(3);
  ot::Mlp model;
  Links links = connect(runtime());
  const Roles roles = links.roles;
  const int64_t restart = links.generation;
  const PsOptions options = async_options();
  const std::string done_key = "test/restarted_worker_done";
  const std::shared_ptr<Store> store = runtime().store();
  if (roles.is_server()) {
    Server server(model.named_parameters(), sgd(), std::move(links), options);
    server.run();
    const Server::Stats stats = server.stats();
    std::printf(
        "ps rejoin: server %d: worker 1 pushed %lld, rejoined %lld time(s); worker 0 "
        "pushed %lld\n",
        roles.server_index(), static_cast<long long>(stats.staleness.worker_updates[1]),
        static_cast<long long>(stats.staleness.rejoins[1]),
        static_cast<long long>(stats.staleness.worker_updates[0]));
    std::fflush(stdout);
    EXPECT_EQ(stats.staleness.worker_updates[1], kBefore + kAfter);
    EXPECT_EQ(stats.staleness.rejoins, (std::vector<int64_t>{0, 1}));
    ASSERT_EQ(stats.lost.size(), 1u);
    EXPECT_NE(stats.lost[0].find("worker 1"), std::string::npos) << stats.lost[0];
    shutdown();
    return;
  }
  const ot::Batch batch = ot::make_batches(1, 8)[0];
  Worker worker(model.named_parameters(), std::move(links), options);
  auto step = [&] { train_step(worker, model, batch); };
  if (roles.worker_index() == 0) {
    train_until_done(worker, step, *store, done_key, std::chrono::seconds(180));
    return;
  }
  if (restart == 0) {
    for (int i = 0; i < kBefore; ++i) step();
    worker.pull();  // answered after every push above was applied
    std::printf("ps rejoin: worker 1 dies at step %lld\n", static_cast<long long>(worker.clock()));
    std::fflush(stdout);
    raise(SIGKILL);
  }
  EXPECT_EQ(restart, 1);
  EXPECT_THROW(runtime().world(), ContractError);  // no world: the others formed it without it
  std::printf("ps rejoin: worker 1 (restart %lld) continues at step %lld\n",
              static_cast<long long>(restart), static_cast<long long>(worker.clock()));
  std::fflush(stdout);
  for (int i = 0; i < kAfter; ++i) step();
  worker.finish();
  store->set(done_key, to_bytes("1"));
  shutdown();
}

// Run as `kolorun -np 2 --servers 1 --restart-workers 1|0`, mode ssp with
// max_staleness 1: worker 1 stops itself (SIGSTOP: alive and silent, as a
// frozen or swapped-out process) after kBefore steps, which holds worker 0's
// pulls back. The server evicts it after evict_after and asks kolorun to
// stop it; kolorun kills it and, with a restart left, starts it again, and
// the new process rejoins and pushes kAfter more. Worker 0 is never the one
// blamed or restarted: it trains on until the store says the restarted
// worker is done.
TEST(PsUnderKolorun, AFrozenSspWorkerIsEvictedAndRejoins) {
  if (!launched_with_servers()) GTEST_SKIP() << "run by tests/integration/ps_fault_test.cc";
  constexpr int kBefore = 10, kAfter = 10;
  init();
  torch::manual_seed(3);
  ot::Mlp model;
  Links links = connect(runtime());
  const Roles roles = links.roles;
  const int64_t restart = links.generation;
  PsOptions options;
  options.mode = Mode::kSsp;
  options.max_staleness = 1;
  options.timeout = std::chrono::seconds(60);
  options.evict_after = std::chrono::seconds(2);
  const std::string done_key = "test/restarted_worker_done";
  const std::shared_ptr<Store> store = runtime().store();
  if (roles.is_server()) {
    Server server(model.named_parameters(), sgd(), std::move(links), options);
    server.run();
    const Server::Stats stats = server.stats();
    std::printf("ps eviction: server %d: worker 1 pushed %lld, rejoined %lld time(s)\n",
                roles.server_index(), static_cast<long long>(stats.staleness.worker_updates[1]),
                static_cast<long long>(stats.staleness.rejoins[1]));
    for (const std::string& lost : stats.lost) std::printf("ps eviction: lost %s\n", lost.c_str());
    std::fflush(stdout);
    EXPECT_EQ(stats.staleness.worker_updates[1], kBefore + kAfter);
    EXPECT_EQ(stats.staleness.rejoins, (std::vector<int64_t>{0, 1}));
    shutdown();
    return;
  }
  const ot::Batch batch = ot::make_batches(1, 8)[0];
  Worker worker(model.named_parameters(), std::move(links), options);
  auto step = [&] { train_step(worker, model, batch); };
  if (roles.worker_index() == 0) {
    train_until_done(worker, step, *store, done_key, std::chrono::seconds(120));
    return;
  }
  if (restart == 0) {
    for (int i = 0; i < kBefore; ++i) step();
    std::printf("ps eviction: worker 1 freezes at step %lld\n",
                static_cast<long long>(worker.clock()));
    std::fflush(stdout);
    raise(SIGSTOP);
    ADD_FAILURE() << "worker 1 was continued, not killed";
    return;
  }
  std::printf("ps eviction: worker 1 (restart %lld) continues at step %lld\n",
              static_cast<long long>(restart), static_cast<long long>(worker.clock()));
  std::fflush(stdout);
  for (int i = 0; i < kAfter; ++i) step();
  worker.finish();
  store->set(done_key, to_bytes("1"));
  shutdown();
}

}  // namespace
}  // namespace kolo::ps
