// Runtime: use before init, a world of one, double init, ranks as threads, and
// multi-rank bootstrap (torchrun-style and kolorun-style) with each "rank" a
// thread reading its own environment map.
#include "kolo/core/runtime.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo {
namespace {

using Vars = std::map<std::string, std::string>;
using std::chrono::milliseconds;

InitOptions options_for(const Vars& vars) {
  InitOptions options;
  options.env = map_env(vars);
  options.timeout = milliseconds(10000);  // nothing in these tests waits longer
  return options;
}

// A TCP port that was free a moment ago.
int free_port() {
  TcpStoreServer probe({});
  return probe.port();
}

// Runs body(rank) for every rank in its own thread; rethrows the first failure.
template <typename Result>
std::vector<Result> run_ranks(int size, std::function<Result(int)> body) {
  std::vector<std::future<Result>> futures;
  for (int r = 0; r < size; ++r) futures.push_back(std::async(std::launch::async, body, r));
  std::vector<Result> results;
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

float allreduce_one(Runtime& runtime, float value) {
  float out = 0;
  runtime.world().allreduce(&value, &out, 1, DType::kF32, AllreduceOptions{});
  return out;
}

TEST(RuntimeApi, EveryCallBeforeInitIsAContractError) {
  ASSERT_FALSE(is_initialized());
  shutdown();  // safe when not initialised
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"rank", [] { rank(); }},
      {"size", [] { size(); }},
      {"local_rank", [] { local_rank(); }},
      {"local_size", [] { local_size(); }},
      {"cross_rank", [] { cross_rank(); }},
      {"cross_size", [] { cross_size(); }},
      {"runtime", [] { runtime(); }}};
  for (const auto& [name, call] : calls) {
    try {
      call();
      ADD_FAILURE() << "kolo::" << name << "() did not throw";
    } catch (const ContractError& e) {
      EXPECT_EQ(std::string(e.what()),
                "kolo::" + name + "() called before kolo::init(); call kolo::init() first");
    }
  }
}

TEST(RuntimeApi, WorldOfOneInitShutdownAndReinit) {
  init(options_for({}));
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(rank(), 0);
  EXPECT_EQ(size(), 1);
  EXPECT_EQ(local_rank(), 0);
  EXPECT_EQ(local_size(), 1);
  EXPECT_EQ(cross_rank(), 0);
  EXPECT_EQ(cross_size(), 1);
  EXPECT_EQ(runtime().topology().source, "none");
  EXPECT_EQ(std::string(runtime().world().backend()), "shm");
  EXPECT_EQ(runtime().store(), nullptr);  // a world of one needs no store
  EXPECT_FLOAT_EQ(allreduce_one(runtime(), 2.5f), 2.5f);
  try {
    init(options_for({}));
    ADD_FAILURE() << "second init() did not throw";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("kolo::init() called twice"), std::string::npos);
  }
  EXPECT_TRUE(is_initialized());  // the failed second init left the first alone
  shutdown();
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW(rank(), ContractError);
  init(options_for({}));  // init after shutdown works
  EXPECT_EQ(size(), 1);
  shutdown();
}

TEST(RuntimeApi, BadOptionsAndConfigAreContractErrors) {
  InitOptions bad_backend = options_for({});
  bad_backend.backend = "nccl";
  EXPECT_THROW(init(bad_backend), ContractError);
  EXPECT_FALSE(is_initialized());
  InitOptions bad_timeout = options_for({});
  bad_timeout.timeout = milliseconds(0);
  EXPECT_THROW(init(bad_timeout), ContractError);
  try {
    init(options_for({{"KOLO_TIMEOUT_SECONDS", "soon"}}));
    ADD_FAILURE() << "a malformed variable did not throw";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("KOLO_TIMEOUT_SECONDS=\"soon\""), std::string::npos);
  }
  EXPECT_FALSE(is_initialized());
}

TEST(Runtime, WrapsThreadCommunicators) {
  auto comms = make_thread_communicators(3, milliseconds(10000));
  auto results = run_ranks<float>(3, [&](int r) {
    Runtime runtime(std::move(comms[r]), Config::load(map_env({})));
    EXPECT_EQ(runtime.topology().rank, r);
    EXPECT_EQ(runtime.topology().size, 3);
    EXPECT_EQ(runtime.topology().local_size, 3);
    EXPECT_EQ(runtime.topology().cross_size, 1);
    EXPECT_EQ(runtime.store(), nullptr);
    return allreduce_one(runtime, float(r + 1));
  });
  for (float v : results) EXPECT_FLOAT_EQ(v, 6.0f);
  EXPECT_THROW(Runtime(nullptr, Config::load(map_env({}))), ContractError);
}

TEST(Runtime, TorchrunStyleRankZeroServesTheStore) {
  const int port = free_port();
  auto results = run_ranks<float>(2, [port](int r) {
    Runtime runtime(options_for({{"RANK", std::to_string(r)},
                                 {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(port)},
                                 {"KOLO_HOSTNAME", "node-a"}}));
    const Topology& t = runtime.topology();
    EXPECT_EQ(t.source, "torchrun");
    EXPECT_EQ(t.serve_store, r == 0);
    // Placement found by exchanging host names through the store.
    EXPECT_TRUE(t.placement_known);
    EXPECT_EQ(t.local_rank, r);
    EXPECT_EQ(t.local_size, 2);
    EXPECT_EQ(t.cross_size, 1);
    EXPECT_EQ(std::string(runtime.world().backend()), "shm");  // auto: one host
    // The store is shared by both ranks.
    runtime.store()->set("hello/" + std::to_string(r), {uint8_t(r)});
    EXPECT_EQ(runtime.store()->get("hello/" + std::to_string(1 - r), milliseconds(10000)),
              Bytes{uint8_t(1 - r)});
    return allreduce_one(runtime, float(r + 1));
  });
  EXPECT_FLOAT_EQ(results[0], 3.0f);
  EXPECT_FLOAT_EQ(results[1], 3.0f);
}

TEST(Runtime, KolorunStyleWithExternalStoreAndRepeatedInit) {
  TcpStoreServer server({});
  auto env = [&](int r) {
    return options_for({{"KOLO_RANK", std::to_string(r)},
                        {"KOLO_SIZE", "3"},
                        {"KOLO_STORE_ADDR", "127.0.0.1"},
                        {"KOLO_STORE_PORT", std::to_string(server.port())},
                        {"KOLO_HOSTNAME", r == 2 ? "node-b" : "node-a"}});
  };
  // Two generations of init against the same store: the second must not see
  // the first one's keys.
  for (int generation = 0; generation < 2; ++generation) {
    auto results = run_ranks<std::vector<int>>(3, [&](int r) {
      InitOptions options = env(r);  // auto: gloo, since the ranks are on two "hosts"
      try {
        Runtime runtime(options);
        const Topology& t = runtime.topology();
        EXPECT_EQ(std::string(runtime.world().backend()), "gloo");
        float sum = allreduce_one(runtime, float(r));
        return std::vector<int>{t.local_rank, t.local_size, t.cross_rank, t.cross_size, int(sum)};
      } catch (const ContractError& e) {
        // Without gloo, auto has no backend for two hosts: that is the expected error.
        EXPECT_NE(std::string(e.what()).find("span 2 hosts"), std::string::npos) << e.what();
        return std::vector<int>{};
      }
    });
    if (!KOLO_HAVE_GLOO && results[0].empty()) continue;
    ASSERT_EQ(results.size(), 3u);
    EXPECT_EQ(results[0], (std::vector<int>{0, 2, 0, 2, 3}));
    EXPECT_EQ(results[1], (std::vector<int>{1, 2, 0, 2, 3}));
    EXPECT_EQ(results[2], (std::vector<int>{0, 1, 1, 2, 3}));
  }
}

TEST(Runtime, ShmAcrossHostsIsAContractError) {
  TcpStoreServer server({});
  InitOptions options = options_for({{"KOLO_RANK", "0"},
                                     {"KOLO_SIZE", "2"},
                                     {"KOLO_LOCAL_RANK", "0"},
                                     {"KOLO_LOCAL_SIZE", "1"},
                                     {"KOLO_CROSS_RANK", "0"},
                                     {"KOLO_CROSS_SIZE", "2"},
                                     {"KOLO_STORE_ADDR", "127.0.0.1"},
                                     {"KOLO_STORE_PORT", std::to_string(server.port())}});
  options.backend = "shm";
  try {
    Runtime runtime(options);
    ADD_FAILURE() << "shm across two hosts did not throw";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("span 2 hosts"), std::string::npos) << e.what();
  }
}

TEST(Runtime, SeveralRanksWithoutAStoreIsAContractErrorSayingWhatToSet) {
  InitOptions options = options_for({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  for (const char* backend : {"shm", "gloo"}) {
    options.backend = backend;
    try {
      Runtime runtime(options);
      ADD_FAILURE() << backend << ": no error";
    } catch (const ContractError& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("needs a rendezvous store for 2 ranks"), std::string::npos) << message;
      EXPECT_NE(message.find("MASTER_ADDR and MASTER_PORT"), std::string::npos) << message;
    }
  }
}

TEST(Runtime, UnreachableStoreIsARuntimeFault) {
  InitOptions options = options_for({{"KOLO_RANK", "1"},
                                     {"KOLO_SIZE", "2"},
                                     {"KOLO_STORE_ADDR", "127.0.0.1"},
                                     {"KOLO_STORE_PORT", std::to_string(free_port())}});
  options.timeout = milliseconds(200);
  options.backend = "shm";
  EXPECT_THROW(Runtime runtime(options), RuntimeFault);
}

}  // namespace
}  // namespace kolo
