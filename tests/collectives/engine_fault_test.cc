// Engine, ranks as threads: stalls (a rank never submits a tensor), a dead
// transport, and shutdown of one rank's engine. Every pending handle fails
// with RuntimeFault naming the ranks involved; nothing hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

class EngineStall : public ::testing::TestWithParam<std::string> {};

// Rank 1 stops submitting a name that was agreed through the cache for a few
// steps (the cached path); rank 2 never submits a name no step had before
// (the full path). Rank 0 warns about both, naming the missing ranks, and
// after the shutdown time every rank holding them fails with RuntimeFault.
TEST_P(EngineStall, WarningNamesMissingRanksAndShutdownFailsEveryHolder) {
  constexpr int n = 3;
  EngineWorld world(GetParam(), n);
  EngineOptions options = testing::test_engine_options();
  options.stall_warning_seconds = 0.3;
  options.stall_shutdown_seconds = 1.0;
  std::vector<std::string> errors(n);
  std::vector<std::vector<int>> failed(n);
  ::testing::internal::CaptureStderr();
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, options);
    Tensor cached({4}, 1);
    for (int step = 0; step < 4; ++step) {
      engine->allreduce_async("cached", cached.view(), cached.view()).wait(kEngineTimeout);
    }
    std::vector<Handle> pending;
    Tensor fresh({2}, 1);
    if (rank != 1)
      pending.push_back(engine->allreduce_async("cached", cached.view(), cached.view()));
    if (rank != 2) pending.push_back(engine->allreduce_async("fresh", fresh.view(), fresh.view()));
    for (Handle& h : pending) {
      try {
        h.wait(kEngineTimeout);
        errors[rank] += "(no error)";
      } catch (const RuntimeFault& e) {
        errors[rank] += std::string(e.what()) + "\n";
        failed[rank].insert(failed[rank].end(), e.failed_ranks().begin(), e.failed_ranks().end());
      }
    }
    // Everyone is still in step: a last collective works.
    Tensor done({1}, float(rank));
    engine->allreduce_async("done", done.view(), done.view(), {ReduceOp::kSum})
        .wait(kEngineTimeout);
    EXPECT_EQ(done.data[0], 3.0f);
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("'cached' (ALLREDUCE"), std::string::npos) << log;
  EXPECT_NE(log.find("missing rank 1; submitted by ranks 0, 2"), std::string::npos) << log;
  EXPECT_NE(log.find("'fresh' (ALLREDUCE"), std::string::npos) << log;
  EXPECT_NE(log.find("missing rank 2; submitted by ranks 0, 1"), std::string::npos) << log;
  EXPECT_NE(log.find("kolo[rank 0] warning: stall"), std::string::npos) << log;
  EXPECT_EQ(log.find("kolo[rank 1] warning: stall"), std::string::npos) << "only rank 0 warns";

  EXPECT_NE(errors[0].find("'cached' stalled: rank(s) 1 did not submit it"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("'fresh' stalled: rank(s) 2 did not submit it"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("'fresh' stalled: rank(s) 2"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("'cached' stalled: rank(s) 1"), std::string::npos) << errors[2];
  EXPECT_EQ(failed[0], (std::vector<int>{1, 2}));
  EXPECT_EQ(failed[1], (std::vector<int>{2}));
  EXPECT_EQ(failed[2], (std::vector<int>{1}));
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineStall, ::testing::ValuesIn(testing::engine_backends()));

// Forwards to a real communicator until `dead` is set, then fails every call
// as a transport whose peer is gone would. While `*frozen` is set, a call
// blocks without reaching the real communicator (a frozen process: its peers
// wait for it), and throws once thawed.
class KillableCommunicator final : public Communicator {
 public:
  KillableCommunicator(std::unique_ptr<Communicator> inner, std::atomic<bool>& dead,
                       std::atomic<bool>* frozen = nullptr)
      : inner_(std::move(inner)), dead_(dead), frozen_(frozen) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& o) override {
    check();
    inner_->allreduce(in, out, count, dtype, o);
  }
  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& o) override {
    check();
    inner_->allgather(in, out, count, dtype, o);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& o) override {
    check();
    inner_->allgatherv(in, out, counts, dtype, o);
  }
  void broadcast(void* buffer, size_t count, DType dtype, const BroadcastOptions& o) override {
    check();
    inner_->broadcast(buffer, count, dtype, o);
  }
  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& o) override {
    check();
    inner_->reducescatter(in, out, count, dtype, o);
  }
  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& o) override {
    check();
    inner_->alltoall(in, out, count, dtype, o);
  }
  void alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                 const std::vector<size_t>& recv, DType dtype,
                 const CollectiveOptions& o) override {
    check();
    inner_->alltoallv(in, send, out, recv, dtype, o);
  }
  void barrier(const CollectiveOptions& o) override {
    check();
    inner_->barrier(o);
  }
  // A frozen rank's own watch sees nothing to wait for (a frozen process
  // runs no code at all).
  std::optional<std::vector<int>> waiting_for() const override {
    if (frozen_ != nullptr && *frozen_) return std::vector<int>{};
    return inner_->waiting_for();
  }
  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    return inner_->abort(reason, ranks);
  }

 private:
  void check() {
    if (frozen_ != nullptr && *frozen_) {
      while (*frozen_) std::this_thread::sleep_for(milliseconds(1));
      throw RuntimeFault("test transport: thawed after the others gave up", {});
    }
    if (dead_) throw RuntimeFault("test transport: the connection broke", {inner_->rank()});
  }
  std::unique_ptr<Communicator> inner_;
  std::atomic<bool>& dead_;
  std::atomic<bool>* frozen_;
};

// A rank whose engine stops negotiating (a frozen process: SIGSTOP, a
// debugger) holds the others in the negotiation's first allreduce, where the
// stall inspector never runs. The NegotiationWatch names it after the warning
// time (from rank 0 only) and fails the others' pending requests with
// RuntimeFault naming it after the shutdown time, long before the
// communicators' 30 s timeout.
class FrozenRank : public ::testing::TestWithParam<std::string> {};

TEST_P(FrozenRank, IsNamedByTheWarningAndTheOthersFailAfterTheShutdownTime) {
  constexpr int n = 3;
  EngineWorld world(GetParam(), n);
  EngineOptions options = testing::test_engine_options();
  options.stall_warning_seconds = 0.3;
  options.stall_shutdown_seconds = 1.0;
  std::atomic<bool> dead{false};
  std::atomic<bool> frozen{false};
  std::atomic<int> failed_count{0};
  std::vector<std::string> errors(n);
  std::vector<std::vector<int>> failed(n);
  ::testing::internal::CaptureStderr();
  run_ranks(n, [&](int rank) {
    std::unique_ptr<Communicator> comm = world.communicator(rank);
    if (rank == 2) comm = std::make_unique<KillableCommunicator>(std::move(comm), dead, &frozen);
    Engine engine(std::move(comm), world.factory(rank), options);
    Tensor x({4}, 1);
    engine.allreduce("warm-up", x.view(), x.view());
    if (rank == 2) {
      frozen = true;
      // Thawed once the others gave up (bounded: the test asserts on them).
      const auto until = std::chrono::steady_clock::now() + kEngineTimeout;
      while (failed_count < 2 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      frozen = false;
      return;
    }
    try {
      engine.allreduce_async("x", x.view(), x.view()).wait(kEngineTimeout);
      errors[rank] = "(no error)";
    } catch (const RuntimeFault& e) {
      errors[rank] = e.what();
      failed[rank] = e.failed_ranks();
    }
    ++failed_count;
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("kolo[rank 0] warning: stall: the negotiation has waited"), std::string::npos)
      << log;
  EXPECT_NE(log.find("KOLO_STALL_WARNING_SECONDS 0.3) for rank 2: frozen"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("kolo[rank 1] warning: stall"), std::string::npos) << "one rank warns\n"
                                                                        << log;
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("rank 2 did not take part in the negotiation"), std::string::npos)
        << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("KOLO_STALL_SHUTDOWN_SECONDS"), std::string::npos)
        << r << ": " << errors[r];
    EXPECT_EQ(failed[r], std::vector<int>{2}) << r << ": " << errors[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FrozenRank, ::testing::ValuesIn(testing::engine_backends()));

TEST(EngineFault, DeadTransportFailsPendingHandlesAndLaterSubmits) {
  constexpr int n = 3;
  // Short communicator timeout: the survivors notice rank 1 is gone in time.
  auto comms = make_thread_communicators(n, milliseconds(1500));
  std::atomic<bool> dead{false};
  std::vector<std::string> errors(n);
  std::vector<std::string> later(n);
  std::vector<std::vector<int>> failed(n);
  run_ranks(n, [&](int rank) {
    std::unique_ptr<Communicator> comm = std::move(comms[rank]);
    if (rank == 1) comm = std::make_unique<KillableCommunicator>(std::move(comm), dead);
    Engine engine(std::move(comm), nullptr, testing::test_engine_options());
    Tensor x({4}, 1);
    engine.allreduce("warm-up", x.view(), x.view());
    // Ranks 0 and 2 submit "x"; rank 1 never does, its transport breaks.
    Handle h;
    if (rank != 1) h = engine.allreduce_async("x", x.view(), x.view());
    if (rank == 1) dead = true;
    if (rank != 1) {
      try {
        h.wait(kEngineTimeout);
        errors[rank] = "(no error)";
      } catch (const RuntimeFault& e) {
        errors[rank] = e.what();
        failed[rank] = e.failed_ranks();
      }
    } else {
      // Rank 1's own engine stops at once: a request it submits fails fast.
      for (int i = 0; i < 1000 && later[rank].empty(); ++i) {
        try {
          engine.allreduce_async("y" + std::to_string(i), x.view(), x.view()).wait(kEngineTimeout);
        } catch (const RuntimeFault& e) {
          later[rank] = e.what();
        }
      }
      return;
    }
    try {
      engine.allreduce_async("after", x.view(), x.view());
      later[rank] = "(accepted)";
    } catch (const RuntimeFault& e) {
      later[rank] = e.what();
    }
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(failed[r], std::vector<int>{1}) << r << ": " << errors[r];
    EXPECT_NE(later[r].find("kolo engine stopped after a fault"), std::string::npos) << later[r];
  }
  EXPECT_NE(later[1].find("connection broke"), std::string::npos) << later[1];
}

TEST(EngineFault, DestroyingOneEngineStopsEveryRankAndFailsTheirPendingRequests) {
  constexpr int n = 2;
  EngineWorld world("threads", n);
  std::string error;
  std::string later;
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Tensor x({4}, 1);
    engine->allreduce("both", x.view(), x.view());
    if (rank == 0) {
      engine.reset();  // rank 0 shuts down while rank 1 still waits
      return;
    }
    // Depending on timing the engine has already stopped (the submit throws)
    // or stops while the request waits (the handle fails): both say so.
    try {
      engine->allreduce_async("only-rank-1", x.view(), x.view()).wait(kEngineTimeout);
    } catch (const RuntimeFault& e) {
      error = e.what();
    }
    try {
      engine->allreduce_async("later", x.view(), x.view());
    } catch (const RuntimeFault& e) {
      later = e.what();
    }
  });
  EXPECT_NE(error.find("shut down"), std::string::npos) << error;
  EXPECT_NE(later.find("shut down"), std::string::npos) << later;
}

}  // namespace
}  // namespace kolo
