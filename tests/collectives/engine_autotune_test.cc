// Engine with KOLO_AUTOTUNE: rank 0's tuner switches the fusion threshold and
// cycle time while steps run; every rank switches in the same cycle (the
// parameters travel in the negotiation), so fused batches keep matching and
// results stay right; the trials are logged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

size_t count_lines_starting(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

TEST(EngineAutotune, RanksSwitchTogetherAndTrialsAreLogged) {
  constexpr int n = 2;
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("kolo_engine_autotune_" + std::to_string(getpid()) + ".csv"))
                              .string();
  EngineWorld world("threads", n);
  EngineOptions options = testing::test_engine_options();
  options.autotune = true;
  options.autotune_log = log;
  std::atomic<bool> enough{false};
  std::vector<std::set<int64_t>> thresholds(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, options);
    constexpr int kTensors = 24;
    std::vector<Tensor> grads(kTensors, Tensor({256}));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int step = 0;; ++step) {
      // Rank 0 decides when to stop; the decision reaches rank 1 through a
      // collective, so both run the same number of steps.
      Tensor stop({1}, rank == 0 && (enough || std::chrono::steady_clock::now() > deadline));
      engine->allreduce("stop", stop.view(), stop.view(), {ReduceOp::kMax});
      if (stop.data[0] > 0) break;
      std::vector<Handle> handles(kTensors);
      for (int t = 0; t < kTensors; ++t) {
        const int u = rank == 0 ? t : kTensors - 1 - t;
        std::fill(grads[u].data.begin(), grads[u].data.end(), float(rank + step + u));
        handles[u] = engine->allreduce_async("g" + std::to_string(u), grads[u].view(),
                                             grads[u].view(), {ReduceOp::kSum});
      }
      for (int t = 0; t < kTensors; ++t) {
        handles[t].wait(kEngineTimeout);
        ASSERT_EQ(grads[t].data[255], float(2 * (step + t) + 1))
            << "rank " << rank << " step " << step << " t " << t << " threshold "
            << engine->fusion_threshold_bytes();
      }
      thresholds[rank].insert(engine->fusion_threshold_bytes());
      if (rank == 0 && count_lines_starting(log, "trial") >= 2) enough = true;
    }
  });
  EXPECT_GE(count_lines_starting(log, "trial"), 2u);
  for (int r = 0; r < n; ++r) EXPECT_GE(thresholds[r].size(), 2u) << "rank " << r;
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace kolo
