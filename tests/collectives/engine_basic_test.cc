// Engine, ranks as threads: every collective kind, submission order that
// differs per rank, many small tensors, name reuse with cache hits and
// evictions, fusion, on the threads, shm and gloo backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
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

class EngineBasic : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string backend() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
};

// Value rank r contributes to element i of tensor t.
float value(int rank, int t, size_t i) { return static_cast<float>(rank + 1) * 0.5f + t + i % 7; }

TEST_P(EngineBasic, AllreduceInReverseAndRandomOrderPerRank) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  constexpr int kTensors = 40;
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    std::vector<Tensor> tensors;
    for (int t = 0; t < kTensors; ++t) {
      Tensor x({static_cast<int64_t>(1 + t * 3)});
      for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = value(rank, t, i);
      tensors.push_back(std::move(x));
    }
    std::vector<int> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    if (rank % 2 == 1) std::reverse(order.begin(), order.end());
    if (rank >= 2) std::shuffle(order.begin(), order.end(), std::mt19937(rank));
    std::vector<Handle> handles(kTensors);
    for (int t : order) {
      RequestOptions o;
      o.op = t % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAverage;
      handles[t] =
          engine->allreduce_async("t" + std::to_string(t), tensors[t].view(), tensors[t].view(), o);
    }
    for (int t = 0; t < kTensors; ++t) {
      handles[t].wait(kEngineTimeout);
      for (size_t i = 0; i < tensors[t].data.size(); ++i) {
        float expected = 0;
        for (int r = 0; r < n; ++r) expected += value(r, t, i);
        if (t % 2 == 1) expected /= n;
        ASSERT_FLOAT_EQ(tensors[t].data[i], expected) << "tensor " << t << " element " << i;
      }
    }
  });
}

TEST_P(EngineBasic, ThousandsOfSmallTensorsInOneStepAreFused) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  constexpr int kTensors = 2000;
  std::vector<Engine::Stats> stats(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    std::vector<Tensor> tensors;
    tensors.reserve(kTensors);
    for (int t = 0; t < kTensors; ++t) tensors.emplace_back(std::vector<int64_t>{4}, rank + t);
    std::vector<Handle> handles;
    for (int k = 0; k < kTensors; ++k) {
      const int t = rank % 2 == 0 ? k : kTensors - 1 - k;
      handles.push_back(engine->allreduce_async("small/" + std::to_string(t), tensors[t].view(),
                                                tensors[t].view(), {ReduceOp::kSum}));
    }
    for (auto& h : handles) h.wait(kEngineTimeout);
    for (int t = 0; t < kTensors; ++t) {
      const float expected = static_cast<float>(n * t + n * (n - 1) / 2);
      ASSERT_EQ(tensors[t].data[0], expected) << t;
      ASSERT_EQ(tensors[t].data[3], expected) << t;
    }
    stats[rank] = engine->stats();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(stats[r].responses, static_cast<uint64_t>(kTensors));
    EXPECT_LT(stats[r].collectives, stats[r].responses / 10) << "fusion should batch them";
  }
}

TEST_P(EngineBasic, NameReuseAcrossStepsHitsTheCacheAndEvicts) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  constexpr int kNames = 12;
  // Thousands of steps where a step is cheap; TCP (gloo) steps cost more.
  const int kSteps = backend() == "gloo" ? 60 : n == 2 ? 2000 : 500;
  std::vector<Engine::Stats> stats(n);
  std::vector<Engine::Stats> small_stats(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    std::vector<Tensor> grads(kNames, Tensor({3}));
    std::mt19937 shuffle(rank * 7 + 1);
    std::vector<int> order(kNames);
    std::iota(order.begin(), order.end(), 0);
    for (int step = 0; step < kSteps; ++step) {
      std::shuffle(order.begin(), order.end(), shuffle);
      std::vector<Handle> handles(kNames);
      for (int t : order) {
        std::fill(grads[t].data.begin(), grads[t].data.end(), float(rank + step + t));
        handles[t] = engine->allreduce_async("grad/" + std::to_string(t), grads[t].view(),
                                             grads[t].view(), {ReduceOp::kSum});
      }
      for (int t = 0; t < kNames; ++t) {
        handles[t].wait(kEngineTimeout);
        ASSERT_EQ(grads[t].data[1], float(n * (step + t) + n * (n - 1) / 2)) << step << " " << t;
      }
    }
    stats[rank] = engine->stats();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(stats[r].responses, uint64_t(kNames * kSteps));
    // All but the first step can be agreed through the cache bit vector.
    EXPECT_GE(stats[r].cache_hits, uint64_t(kNames * (kSteps - 2)));
    EXPECT_EQ(stats[r].cache_evictions, 0u);
  }

  // A cache smaller than the working set: entries are evicted and results
  // stay right.
  EngineWorld small(backend(), n);
  run_ranks(n, [&](int rank) {
    EngineOptions o = testing::test_engine_options();
    o.cache_capacity = 4;
    auto engine = small.engine(rank, o);
    std::vector<Tensor> grads(kNames, Tensor({2}));
    for (int step = 0; step < (backend() == "gloo" ? 10 : 40); ++step) {
      std::vector<Handle> handles(kNames);
      for (int t = 0; t < kNames; ++t) {
        const int u = rank % 2 == 0 ? t : kNames - 1 - t;
        std::fill(grads[u].data.begin(), grads[u].data.end(), float(rank));
        handles[u] = engine->allreduce_async("g" + std::to_string(u), grads[u].view(),
                                             grads[u].view(), {ReduceOp::kSum});
      }
      for (int t = 0; t < kNames; ++t) {
        handles[t].wait(kEngineTimeout);
        ASSERT_EQ(grads[t].data[0], float(n * (n - 1) / 2));
      }
    }
    small_stats[rank] = engine->stats();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(small_stats[r].cache_evictions, 0u);
    EXPECT_EQ(small_stats[r].cache_evictions, small_stats[0].cache_evictions);
  }
}

TEST_P(EngineBasic, BroadcastFromEveryRoot) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor> buffers;
      for (int root = 0; root < n; ++root) buffers.emplace_back(std::vector<int64_t>{2, 5}, rank);
      std::vector<Handle> handles;
      for (int k = 0; k < n; ++k) {
        const int root = rank % 2 == 0 ? k : n - 1 - k;
        RequestOptions o;
        o.root = root;
        handles.push_back(
            engine->broadcast_async("b" + std::to_string(root), buffers[root].view(), o));
      }
      for (auto& h : handles) h.wait(kEngineTimeout);
      for (int root = 0; root < n; ++root) {
        for (float v : buffers[root].data) ASSERT_EQ(v, float(root));
      }
    }
    Tensor single({3}, rank * 10);
    RequestOptions o;
    o.root = n - 1;
    engine->broadcast("single", single.view(), o);
    EXPECT_EQ(single.data[2], float((n - 1) * 10));
  });
}

TEST_P(EngineBasic, AllgatherWithDifferentFirstDimensions) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (int step = 0; step < 3; ++step) {
      // Tensor a: rank r has r + step rows (rank 0 none at step 0); b: 2 rows.
      Tensor a({rank + step, 3});
      for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = rank * 100 + float(i);
      Tensor b({2}, rank);
      Tensor a_out, b_out;
      Handle ha = engine->allgather_async("a", a.view(), testing::allocate_into(a_out));
      Handle hb = engine->allgather_async("b", b.view(), testing::allocate_into(b_out));
      ha.wait(kEngineTimeout);
      hb.wait(kEngineTimeout);
      int64_t rows = 0;
      for (int r = 0; r < n; ++r) rows += r + step;
      ASSERT_EQ(a_out.shape, (std::vector<int64_t>{rows, 3}));
      size_t at = 0;
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < (r + step) * 3; ++i) ASSERT_EQ(a_out.data[at++], r * 100 + float(i));
      }
      std::vector<int64_t> expected_rows;
      for (int r = 0; r < n; ++r) expected_rows.push_back(r + step);
      EXPECT_EQ(ha.received_splits(), expected_rows);
      EXPECT_EQ(ha.output().data, a_out.data.data());
      ASSERT_EQ(b_out.shape, (std::vector<int64_t>{2 * n}));
      for (int r = 0; r < n; ++r) ASSERT_EQ(b_out.data[2 * r + 1], float(r));
    }
  });
}

TEST_P(EngineBasic, ReducescatterEvenAndUneven) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (int64_t rows : {int64_t(n * 3), int64_t(n * 3 + 1), int64_t(1)}) {
      Tensor in({rows, 2});
      for (size_t i = 0; i < in.data.size(); ++i) in.data[i] = float(i) + rank;
      Tensor out(Engine::reducescatter_shape(in.shape, n, rank));
      RequestOptions o;
      o.op = ReduceOp::kSum;
      engine->reducescatter_async("rs" + std::to_string(rows), in.view(), out.view(), o)
          .wait(kEngineTimeout);
      // This rank's rows start after the rows of the ranks before it.
      int64_t first = 0;
      for (int k = 0; k < rank; ++k) first += Engine::reducescatter_shape(in.shape, n, k)[0];
      for (size_t i = 0; i < out.data.size(); ++i) {
        const float expected = n * float(first * 2 + i) + float(n * (n - 1) / 2);
        ASSERT_EQ(out.data[i], expected) << "rows " << rows << " element " << i;
      }
    }
  });
}

// The in-place forms engine.h promises (ZeRO relies on them): an allgather
// whose input is this rank's own rows of its output, alone and fused with
// another allgather; a reducescatter whose output is the start of its input,
// with an even and an uneven split.
TEST_P(EngineBasic, AllgatherAndReducescatterInPlace) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    for (bool fused : {false, true}) {
      constexpr int64_t kRows = 3;  // per rank
      Tensor full({kRows * n, 2});
      for (int64_t i = 0; i < kRows * 2; ++i) full.data[rank * kRows * 2 + i] = rank * 100 + i;
      TensorView mine{full.data.data() + rank * kRows * 2, DType::kF32, {kRows, 2}};
      AllocateOutput into_full = [&full](const std::vector<int64_t>& shape) {
        EXPECT_EQ(shape, full.shape);
        return full.view();
      };
      const std::string tag = fused ? "/fused" : "/alone";
      Handle h = engine->allgather_async("ag" + tag, mine, into_full);
      Tensor other({1}, rank);
      Tensor other_out;
      Handle h2;
      if (fused)
        h2 = engine->allgather_async("ag2", other.view(), testing::allocate_into(other_out));
      h.wait(kEngineTimeout);
      if (fused) h2.wait(kEngineTimeout);
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < kRows * 2; ++i)
          ASSERT_EQ(full.data[r * kRows * 2 + i], r * 100 + i) << tag << " rank " << r;
      }
      if (fused) {
        for (int r = 0; r < n; ++r) ASSERT_EQ(other_out.data[r], float(r));
      }
    }
    for (int64_t rows : {int64_t(n * 2), int64_t(n * 2 + 1)}) {
      Tensor buffer({rows, 2});
      for (size_t i = 0; i < buffer.data.size(); ++i) buffer.data[i] = float(i) + rank;
      const std::vector<int64_t> out_shape = Engine::reducescatter_shape(buffer.shape, n, rank);
      TensorView out{buffer.data.data(), DType::kF32, out_shape};  // the start of the input
      RequestOptions o;
      o.op = ReduceOp::kSum;
      engine->reducescatter_async("rs-in-place" + std::to_string(rows), buffer.view(), out, o)
          .wait(kEngineTimeout);
      int64_t first = 0;
      for (int k = 0; k < rank; ++k) first += Engine::reducescatter_shape(buffer.shape, n, k)[0];
      for (int64_t i = 0; i < out_shape[0] * 2; ++i) {
        const float expected = n * float(first * 2 + i) + float(n * (n - 1) / 2);
        ASSERT_EQ(buffer.data[i], expected) << "rows " << rows << " element " << i;
      }
    }
  });
}

TEST_P(EngineBasic, AlltoallWithSplits) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    // Rank s sends (s + d) % 3 rows to rank d; row values encode s, d.
    std::vector<int64_t> splits(n);
    int64_t rows = 0;
    for (int d = 0; d < n; ++d) rows += splits[d] = (rank + d) % 3;
    Tensor in({rows, 2});
    size_t at = 0;
    for (int d = 0; d < n; ++d) {
      for (int64_t k = 0; k < splits[d] * 2; ++k) in.data[at++] = rank * 10 + d;
    }
    Tensor out;
    Handle h = engine->alltoall_async("a2a", in.view(), splits, testing::allocate_into(out));
    h.wait(kEngineTimeout);
    std::vector<int64_t> received(n);
    at = 0;
    for (int s = 0; s < n; ++s) {
      received[s] = (s + rank) % 3;
      for (int64_t k = 0; k < received[s] * 2; ++k) ASSERT_EQ(out.data[at++], s * 10 + rank);
    }
    EXPECT_EQ(h.received_splits(), received);
    EXPECT_EQ(at, out.data.size());
    // Equal split (empty splits).
    Tensor even({2 * n}, rank);
    Tensor even_out;
    engine->alltoall_async("a2a-even", even.view(), {}, testing::allocate_into(even_out))
        .wait(kEngineTimeout);
    for (int s = 0; s < n; ++s) ASSERT_EQ(even_out.data[2 * s], float(s));
  });
}

TEST_P(EngineBasic, CallbacksPollAndSynchronousForms) {
  const int n = world_size();
  EngineWorld world(backend(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Tensor x({5}, 1);
    std::atomic<int> called{0};
    Handle h = engine->allreduce_async("cb", x.view(), x.view(), {ReduceOp::kSum});
    h.on_complete([&](std::exception_ptr e) {
      EXPECT_EQ(e, nullptr);
      ++called;
    });
    h.wait(kEngineTimeout);
    EXPECT_TRUE(h.poll());
    h.on_complete([&](std::exception_ptr) { ++called; });  // already done: runs here
    EXPECT_EQ(called.load(), 2);
    EXPECT_EQ(x.data[0], float(n));
    Tensor y({2}, rank);
    Tensor out({2});
    engine->allreduce("sync", y.view(), out.view(), {ReduceOp::kMax});
    EXPECT_EQ(out.data[0], float(n - 1));
    EXPECT_EQ(y.data[0], float(rank));
  });
}

std::string param_name(const ::testing::TestParamInfo<EngineBasic::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineBasic,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(2, 3, 4)),
                         param_name);

// make_solo_engine: an engine of one rank, needing no store or peer (a
// parameter-server worker's own): each collective gives back its input, on
// the world and on a process set of that one rank.
TEST(SoloEngine, EveryCollectiveIsThisRanksOwn) {
  std::unique_ptr<Engine> engine = make_solo_engine();
  EXPECT_EQ(engine->rank(), 0);
  EXPECT_EQ(engine->size(), 1);
  Tensor x({4}, 3);
  Tensor out({4});
  engine->allreduce("metric", x.view(), out.view(), {ReduceOp::kAverage});
  EXPECT_EQ(out.data, x.data);
  const ProcessSet own = engine->add_process_set({0});
  RequestOptions on_set;
  on_set.op = ReduceOp::kSum;
  on_set.process_set = own.id();
  engine->allreduce("metric/set", x.view(), out.view(), on_set);
  EXPECT_EQ(out.data, x.data);
}

// ---- submit-time argument checks (no other rank needed) -------------------------

TEST(EngineArguments, BadRequestsThrowContractErrorAtSubmit) {
  auto comms = make_thread_communicators(1, kEngineTimeout);
  Engine engine(std::move(comms[0]), nullptr, testing::test_engine_options());
  Tensor x({4});
  Tensor wrong({5});
  EXPECT_THROW(engine.allreduce_async("", x.view(), x.view()), ContractError);
  EXPECT_THROW(engine.allreduce_async("__kolo/x", x.view(), x.view()), ContractError);
  EXPECT_THROW(engine.allreduce_async("x", x.view(), wrong.view()), ContractError);
  RequestOptions other_set;
  other_set.process_set = 3;
  EXPECT_THROW(engine.allreduce_async("x", x.view(), x.view(), other_set), ContractError);
  RequestOptions bad_root;
  bad_root.root = 1;
  EXPECT_THROW(engine.broadcast_async("x", x.view(), bad_root), ContractError);
  EXPECT_THROW(engine.alltoall_async("x", x.view(), {3}, testing::allocate_into(wrong)),
               ContractError);
  Tensor scalar(std::vector<int64_t>{});
  EXPECT_THROW(engine.allgather_async("x", scalar.view(), testing::allocate_into(wrong)),
               ContractError);
  TensorView null_view{nullptr, DType::kF32, {3}};
  EXPECT_THROW(engine.allreduce_async("x", null_view, null_view), ContractError);
  EXPECT_THROW(engine.add_process_set({0, 0}), ContractError);
  EXPECT_THROW(engine.add_process_set({1}), ContractError);
  EXPECT_THROW(engine.remove_process_set(0), ContractError);
  // A name still pending cannot be submitted again; once done, it can.
  Handle h = engine.allreduce_async("x", x.view(), x.view());
  h.wait(kEngineTimeout);
  engine.allreduce_async("x", x.view(), x.view()).wait(kEngineTimeout);
  EXPECT_EQ(engine.stats().responses, 2u);
}

TEST(EngineArguments, DuplicatePendingNameIsRefused) {
  auto comms = make_thread_communicators(2, kEngineTimeout);
  run_ranks(2, [&](int rank) {
    Engine engine(std::move(comms[rank]), nullptr, testing::test_engine_options());
    Tensor x({4}, 1);
    Tensor y({4}, 1);
    if (rank == 0) {
      Handle h = engine.allreduce_async("dup", x.view(), x.view());
      EXPECT_THROW(engine.allreduce_async("dup", y.view(), y.view()), ContractError);
      // Rank 1 submits only after this, so "dup" is surely still pending above.
      engine.broadcast("go", y.view());
      h.wait(kEngineTimeout);
    } else {
      engine.broadcast("go", y.view());
      engine.allreduce_async("dup", x.view(), x.view()).wait(kEngineTimeout);
    }
    EXPECT_EQ(x.data[0], 1.0f);  // average of 1 and 1
  });
}

TEST(EngineShape, ReducescatterShape) {
  EXPECT_EQ(Engine::reducescatter_shape({10, 3}, 4, 0), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(Engine::reducescatter_shape({10, 3}, 4, 1), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(Engine::reducescatter_shape({10, 3}, 4, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Engine::reducescatter_shape({10}, 4, 3), (std::vector<int64_t>{2}));
  EXPECT_THROW(Engine::reducescatter_shape({}, 4, 3), ContractError);
  EXPECT_THROW(Engine::reducescatter_shape({4}, 4, 4), ContractError);
}

}  // namespace
}  // namespace kolo
