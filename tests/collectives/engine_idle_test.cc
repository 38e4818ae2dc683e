// Engine, ranks as threads: a world with nothing pending stops negotiating
// every cycle (engine_thread.cc's idle backoff) and still answers the next
// request on every rank, and a rank outside a busy process set does not hold
// the set's members back while it idles.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
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

class EngineIdle : public ::testing::TestWithParam<std::string> {};

// 1 ms cycles, as by default: an engine that kept cycling while idle would
// run ~300 negotiations in the 300 ms below.
EngineOptions one_ms_cycles() {
  EngineOptions o = testing::test_engine_options();
  o.cycle_time_ms = 1;
  return o;
}

TEST_P(EngineIdle, IdleWorldBacksOffAndWakesForTheNextRequest) {
  constexpr int n = 2;
  EngineWorld world(GetParam(), n);
  std::vector<uint64_t> idle_cycles(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, one_ms_cycles());
    for (int step = 0; step < 3; ++step) {
      Tensor t({16}, static_cast<float>(rank + step));
      engine->allreduce_async("w", t.view(), t.view(), {ReduceOp::kSum}).wait(kEngineTimeout);
      ASSERT_EQ(t.data[15], static_cast<float>(2 * step + 1)) << step;
      if (step == 1) {
        const uint64_t before = engine->stats().cycles;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a long forward pass
        idle_cycles[rank] = engine->stats().cycles - before;
      }
    }
  });
  for (int r = 0; r < n; ++r) {
    // Backoff waits up to 20 ms per cycle: ~15 cycles; a loaded machine only
    // lowers the count.
    EXPECT_LT(idle_cycles[r], 100u) << "rank " << r << " kept negotiating while idle";
  }
}

TEST_P(EngineIdle, RankOutsideABusySetDoesNotStallItsMembers) {
  constexpr int n = 3;
  EngineWorld world(GetParam(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, one_ms_cycles());
    const int set = engine->add_process_set({0, 1}).id();
    if (rank == 2) {
      // Idle for the whole exchange below; its engine must keep set 0's
      // negotiation going while ranks 0 and 1 have work in their set.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } else {
      RequestOptions o;
      o.op = ReduceOp::kSum;
      o.process_set = set;
      for (int step = 0; step < 50; ++step) {
        Tensor t({4}, static_cast<float>(rank + step));
        engine->allreduce_async("s", t.view(), t.view(), o).wait(kEngineTimeout);
        ASSERT_EQ(t.data[0], static_cast<float>(2 * step + 1)) << step;
      }
    }
    engine->remove_process_set(set);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineIdle, ::testing::ValuesIn(testing::engine_backends()));

}  // namespace
}  // namespace kolo
