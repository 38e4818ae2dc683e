// Engine, ranks as threads: join() with ranks that run different numbers of
// steps (uneven data), and process sets with overlapping members.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

class EngineJoin : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

float value(int rank, int step, size_t i) { return float(rank * 10 + step) + 0.25f * float(i); }

// Rank r runs steps(r) steps of every collective kind, then joins. At step k
// the ranks still running contribute; the joined ones add nothing.
TEST_P(EngineJoin, UnevenStepsGiveSumsAndAveragesOverTheRanksStillRunning) {
  // Not a structured binding: lambdas below capture n, which clang before 16
  // (the sanitizer build's) rejects for bindings.
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  EngineWorld world(backend, n);
  auto steps = [](int rank) { return 2 + 2 * rank; };
  std::vector<int> last(n, -1);
  std::vector<int> last_again(n, -1);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (int k = 0; k < steps(rank); ++k) {
      std::vector<int> running;
      for (int r = 0; r < n; ++r) {
        if (steps(r) > k) running.push_back(r);
      }
      const float count = float(running.size());
      Tensor sum({5}), avg({5}), mx({5}), prod({2});
      for (size_t i = 0; i < 5; ++i) sum.data[i] = avg.data[i] = mx.data[i] = value(rank, k, i);
      prod.data = {2.0f, float(rank + 1)};
      Tensor gathered;
      Tensor rows({rank + 1, 2}, float(rank));
      Tensor bcast({3}, float(rank));
      RequestOptions root_last;
      root_last.root = n - 1;  // runs longest, so never joined
      Tensor rs_in({2 * n}, 1.0f);
      Tensor rs_out(Engine::reducescatter_shape(rs_in.shape, n, rank));
      std::vector<int64_t> splits(n, 1);
      Tensor a2a_in({n}, float(rank));
      Tensor a2a_out;
      std::vector<Handle> handles = {
          engine->allreduce_async("sum", sum.view(), sum.view(), {ReduceOp::kSum}),
          engine->allreduce_async("avg", avg.view(), avg.view(), {ReduceOp::kAverage}),
          engine->allreduce_async("max", mx.view(), mx.view(), {ReduceOp::kMax}),
          engine->allreduce_async("prod", prod.view(), prod.view(), {ReduceOp::kProduct}),
          engine->allgather_async("rows", rows.view(), testing::allocate_into(gathered)),
          engine->broadcast_async("bcast", bcast.view(), root_last),
          engine->reducescatter_async("rs", rs_in.view(), rs_out.view(), {ReduceOp::kSum}),
          engine->alltoall_async("a2a", a2a_in.view(), splits, testing::allocate_into(a2a_out)),
      };
      for (auto& h : handles) h.wait(kEngineTimeout);
      for (size_t i = 0; i < 5; ++i) {
        float s = 0, m = -1e30f;
        for (int r : running) {
          s += value(r, k, i);
          m = std::max(m, value(r, k, i));
        }
        ASSERT_FLOAT_EQ(sum.data[i], s) << "step " << k;
        ASSERT_FLOAT_EQ(avg.data[i], s / count) << "step " << k;
        ASSERT_FLOAT_EQ(mx.data[i], m) << "step " << k;
      }
      float p = 1;
      for (int r : running) p *= float(r + 1);
      ASSERT_EQ(prod.data[0], float(1 << running.size()));
      ASSERT_EQ(prod.data[1], p);
      size_t at = 0;
      for (int r : running) {
        for (int i = 0; i < (r + 1) * 2; ++i) ASSERT_EQ(gathered.data[at++], float(r));
      }
      ASSERT_EQ(at, gathered.data.size());
      ASSERT_EQ(bcast.data[0], float(n - 1));
      for (float v : rs_out.data) ASSERT_EQ(v, count);
      ASSERT_EQ(a2a_out.shape[0], int64_t(running.size()));
      for (size_t j = 0; j < running.size(); ++j) ASSERT_EQ(a2a_out.data[j], float(running[j]));
    }
    last[rank] = engine->join();

    // After everyone joined the engine is back to normal; join again with
    // rank 0 running longest.
    Tensor x({3}, 1.0f);
    engine->allreduce_async("sum", x.view(), x.view(), {ReduceOp::kSum}).wait(kEngineTimeout);
    ASSERT_EQ(x.data[0], float(n));
    if (rank == 0) {
      for (int k = 0; k < 3; ++k) {
        Tensor y({3}, 4.0f);
        engine->allreduce_async("avg", y.view(), y.view()).wait(kEngineTimeout);
        ASSERT_EQ(y.data[2], 4.0f);  // the average over rank 0 alone
      }
    }
    last_again[rank] = engine->join();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(last[r], n - 1);
    EXPECT_EQ(last_again[r], 0);
  }
}

// A rank submits a (cached) tensor and joins without waiting for it: the
// tensor still counts as its contribution, not as a joined rank's zeros.
TEST_P(EngineJoin, RequestSubmittedJustBeforeJoinStillContributes) {
  // Not a structured binding: lambdas below capture n, which clang before 16
  // (the sanitizer build's) rejects for bindings.
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  EngineWorld world(backend, n);
  std::vector<int> last(n, -1);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (int step = 0; step < 4; ++step) {
      Tensor x({4}, 1.0f);
      engine->allreduce_async("tail", x.view(), x.view(), {ReduceOp::kSum}).wait(kEngineTimeout);
      ASSERT_EQ(x.data[0], float(n));
    }
    Tensor x({4}, float(rank + 1));
    if (rank == 0) {
      Handle h = engine->allreduce_async("tail", x.view(), x.view(), {ReduceOp::kSum});
      last[rank] = engine->join();
      h.wait(kEngineTimeout);
    } else {
      // The others submit later, after rank 0 has (most likely) joined.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      engine->allreduce_async("tail", x.view(), x.view(), {ReduceOp::kSum}).wait(kEngineTimeout);
      last[rank] = engine->join();
    }
    EXPECT_EQ(x.data[3], float(n * (n + 1) / 2)) << "rank " << rank;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(last[r], last[0]);
    EXPECT_NE(last[r], 0);
  }
}

std::string param_name(const ::testing::TestParamInfo<EngineJoin::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineJoin,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(2, 3, 4)),
                         param_name);

class EngineProcessSets : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Overlapping sets, e.g. for 4 ranks {0,1,2}, {1,2,3}, {0,3}: each member
// submits on all its sets and the world in its own order; sums cover exactly
// the members. A non-member's request is a ContractError at submit.
TEST_P(EngineProcessSets, OverlappingSetsNegotiateIndependently) {
  // Not a structured binding: lambdas below capture n, which clang before 16
  // (the sanitizer build's) rejects for bindings.
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  EngineWorld world(backend, n);
  std::vector<std::vector<int>> members;
  if (n == 4) {
    members = {{0, 1, 2}, {1, 2, 3}, {0, 3}};
  } else {
    members = {{0, 1}, {1, 2}, {0, 2}};
  }
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    std::vector<int> ids;
    for (const auto& m : members) ids.push_back(engine->add_process_set(m).id());
    EXPECT_EQ(ids, (std::vector<int>{1, 2, 3}));
    for (int step = 0; step < 20; ++step) {
      std::vector<int> mine;  // indices of the sets this rank is in
      for (size_t s = 0; s < members.size(); ++s) {
        if (std::count(members[s].begin(), members[s].end(), rank)) mine.push_back(int(s));
      }
      if ((rank + step) % 2 == 1) std::reverse(mine.begin(), mine.end());
      std::vector<Tensor> values;
      std::vector<Handle> handles;
      values.reserve(mine.size() + 1);
      Tensor all({4}, float(rank + step));
      for (int s : mine) {
        values.emplace_back(std::vector<int64_t>{4}, float(rank + step));
        RequestOptions o;
        o.op = ReduceOp::kSum;
        o.process_set = ids[s];
        // The same name in every set: sets are separate name spaces.
        handles.push_back(
            engine->allreduce_async("grad", values.back().view(), values.back().view(), o));
      }
      handles.push_back(engine->allreduce_async("grad", all.view(), all.view(), {ReduceOp::kSum}));
      for (auto& h : handles) h.wait(kEngineTimeout);
      for (size_t j = 0; j < mine.size(); ++j) {
        float expected = 0;
        for (int r : members[mine[j]]) expected += float(r + step);
        ASSERT_EQ(values[j].data[3], expected) << "set " << ids[mine[j]] << " step " << step;
      }
      ASSERT_EQ(all.data[0], float(n * step + n * (n - 1) / 2));
    }
    // Broadcast within a set from its second member (set rank 1).
    for (size_t s = 0; s < members.size(); ++s) {
      const auto& m = members[s];
      auto pos = std::find(m.begin(), m.end(), rank);
      Tensor b({2}, float(rank));
      RequestOptions o;
      o.process_set = ids[s];
      o.root = 1;
      if (pos == m.end()) {
        EXPECT_THROW(engine->broadcast_async("b", b.view(), o), ContractError);
        continue;
      }
      engine->broadcast("b", b.view(), o);
      ASSERT_EQ(b.data[1], float(m[1]));
    }
    engine->remove_process_set(ids[1]);
    Tensor z({1});
    RequestOptions removed;
    removed.process_set = ids[1];
    EXPECT_THROW(engine->allreduce_async("z", z.view(), z.view(), removed), ContractError);
    // A new set after a removal gets a fresh id on every rank.
    EXPECT_EQ(engine->add_process_set({0, n - 1}).id(), 4);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineProcessSets,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kolo
