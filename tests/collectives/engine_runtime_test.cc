// Runtime::engine(): built lazily and once from any thread, on its own
// communicator next to the caller's world communicator, with process sets
// through the runtime's store; settings from the registry.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

class RuntimeEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(RuntimeEngine, LazyEngineNextToTheWorldCommunicatorWithProcessSets) {
  constexpr int n = 3;
  TcpStoreServer server({});
  run_ranks(n, [&](int rank) {
    InitOptions options;
    options.env = map_env({{"KOLO_RANK", std::to_string(rank)},
                           {"KOLO_SIZE", std::to_string(n)},
                           {"KOLO_STORE_ADDR", "127.0.0.1"},
                           {"KOLO_STORE_PORT", std::to_string(server.port())},
                           {"KOLO_BACKEND", GetParam()},
                           {"KOLO_TIMEOUT_SECONDS", "30"},
                           {"KOLO_CYCLE_TIME_MS", "0.5"}});
    Runtime runtime(options);
    // Two threads ask for the engine at once: one engine is built.
    Engine* from_thread = nullptr;
    std::thread other([&] { from_thread = &runtime.engine(); });
    Engine& engine = runtime.engine();
    other.join();
    EXPECT_EQ(from_thread, &engine);
    EXPECT_EQ(engine.rank(), rank);
    EXPECT_EQ(engine.size(), n);
    EXPECT_EQ(engine.cycle_time_ms(), 0.5);

    // The engine works while this thread uses the world communicator.
    Tensor x({16}, float(rank));
    Handle h = engine.allreduce_async("x", x.view(), x.view(), {ReduceOp::kSum});
    float mine = 1.0f;
    float total = 0.0f;
    runtime.world().allreduce(&mine, &total, 1, DType::kF32, AllreduceOptions{});
    h.wait(kEngineTimeout);
    EXPECT_EQ(total, float(n));
    EXPECT_EQ(x.data[15], 3.0f);

    // A process set through the runtime's factory.
    const int set = engine.add_process_set({0, 2}).id();
    Tensor y({4}, float(rank + 1));
    if (rank != 1) {
      RequestOptions o;
      o.op = ReduceOp::kSum;
      o.process_set = set;
      engine.allreduce("y", y.view(), y.view(), o);
      EXPECT_EQ(y.data[0], 4.0f);  // ranks 0 and 2: 1 + 3
    }
    // Every rank finishes its engine work before the runtime goes (the
    // engine's shutdown is collective).
    Tensor done({1});
    engine.allreduce("done", done.view(), done.view());
  });
}

std::vector<std::string> runtime_backends() {
  std::vector<std::string> names = {"shm"};
#if KOLO_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

INSTANTIATE_TEST_SUITE_P(Backends, RuntimeEngine, ::testing::ValuesIn(runtime_backends()));

TEST(RuntimeEngineThreads, EngineCommunicatorIsHandedIn) {
  constexpr int n = 2;
  auto worlds = make_thread_communicators(n, kEngineTimeout);
  auto engine_comms = make_thread_communicators(n, kEngineTimeout);
  run_ranks(n, [&](int rank) {
    Runtime runtime(std::move(worlds[rank]), Config::load(map_env({})),
                    std::move(engine_comms[rank]));
    Tensor x({3}, 2.0f);
    runtime.engine().allreduce("x", x.view(), x.view());
    EXPECT_EQ(x.data[0], 2.0f);
  });

  auto single = make_thread_communicators(1, kEngineTimeout);
  Runtime without(std::move(single[0]), Config::load(map_env({})));
  EXPECT_THROW(without.engine(), ContractError);
}

TEST(EngineOptionsTest, FromConfigReadsTheRegistry) {
  const Config config = Config::load(map_env({{"KOLO_CYCLE_TIME_MS", "2.5"},
                                              {"KOLO_FUSION_THRESHOLD_BYTES", "1048576"},
                                              {"KOLO_CACHE_CAPACITY", "16"},
                                              {"KOLO_STALL_WARNING_SECONDS", "5"},
                                              {"KOLO_STALL_SHUTDOWN_SECONDS", "0"},
                                              {"KOLO_TIMELINE", "/tmp/t.json"},
                                              {"KOLO_TIMELINE_ALL_RANKS", "1"},
                                              {"KOLO_AUTOTUNE", "1"},
                                              {"KOLO_AUTOTUNE_LOG", "/tmp/a.csv"}}));
  const EngineOptions o = EngineOptions::from_config(config);
  EXPECT_EQ(o.cycle_time_ms, 2.5);
  EXPECT_EQ(o.fusion_threshold_bytes, 1048576);
  EXPECT_EQ(o.cache_capacity, 16);
  EXPECT_EQ(o.stall_warning_seconds, 5);
  EXPECT_EQ(o.stall_shutdown_seconds, 0);
  EXPECT_EQ(o.timeline_path, "/tmp/t.json");
  EXPECT_TRUE(o.timeline_all_ranks);
  EXPECT_TRUE(o.autotune);
  EXPECT_EQ(o.autotune_log, "/tmp/a.csv");
  const EngineOptions d = EngineOptions::from_config(Config::load(map_env({})));
  EXPECT_EQ(d.cycle_time_ms, 1.0);
  EXPECT_EQ(d.fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(d.cache_capacity, 1024);
  EXPECT_EQ(d.stall_warning_seconds, 30);
  EXPECT_EQ(d.stall_shutdown_seconds, 300);
  EXPECT_TRUE(d.timeline_path.empty());
  EXPECT_FALSE(d.autotune);
}

}  // namespace
}  // namespace kolo
