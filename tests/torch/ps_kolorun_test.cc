// The parameter server as real processes: run by tests/integration/ps_fault_test.cc as
// `kolorun -np 2 --servers 1 kolo_torch_tests --gtest_filter=PsUnderKolorun.*`
// (skipped when not launched with servers). Every process runs the test in
// its role; the integration test checks what each of them printed.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/parameter_server.h"
#include "optimizer_harness.h"

namespace kolo::ps {
namespace {

namespace ot = kolo::optimizer_testing;

bool launched_with_servers() { return std::getenv("KOLO_PS_SERVERS") != nullptr; }

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
  PsOptions options;
  options.mode = Mode::kAsync;
  options.timeout = std::chrono::seconds(60);  // far beyond how long the fault takes
  if (roles.is_server()) {
    Server server(
        model.named_parameters(),
        [](std::vector<torch::Tensor> p) {
          return ot::make_optimizer(ot::OptimizerKind::kSgd, std::move(p), 0.05);
        },
        std::move(links), options);
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

}  // namespace
}  // namespace kolo::ps
