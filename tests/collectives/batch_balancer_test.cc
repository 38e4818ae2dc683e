// BatchBalancer: the split (proportional, floored, summing to the global
// batch), and ranks as threads agreeing on it from their measured compute
// times, with bad options an error on every rank.
#include "kolo/core/batch_balancer.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::run_ranks;

int64_t total(const std::vector<int64_t>& batches) {
  return std::accumulate(batches.begin(), batches.end(), int64_t{0});
}

TEST(BatchBalancerSplit, ProportionalToTheRatesAndSummingToTheGlobalBatch) {
  EXPECT_EQ(BatchBalancer::split(90, {1.0, 2.0}, 0.25), (std::vector<int64_t>{30, 60}));
  EXPECT_EQ(BatchBalancer::split(128, {1.0, 1.0}, 0.25), (std::vector<int64_t>{64, 64}));
  // 100 / 3: the first of the equal remainders takes the extra sample.
  EXPECT_EQ(BatchBalancer::split(100, {5.0, 5.0, 5.0}, 0.25), (std::vector<int64_t>{34, 33, 33}));
  // Largest remainder: 128 * 1.1 / 2.1 = 67.05, 128 * 1 / 2.1 = 60.95.
  EXPECT_EQ(BatchBalancer::split(128, {1.1, 1.0}, 0.25), (std::vector<int64_t>{67, 61}));
  for (int n = 1; n <= 7; ++n) {
    for (int64_t g : {int64_t{n}, int64_t{n + 1}, int64_t{64}, int64_t{1000}}) {
      std::vector<double> rates;
      for (int r = 0; r < n; ++r) rates.push_back(1.0 + 0.37 * r);
      const auto batches = BatchBalancer::split(g, rates, 0.25);
      ASSERT_EQ(total(batches), g) << n << " ranks, " << g;
      for (int64_t b : batches) EXPECT_GE(b, 1) << n << " ranks, " << g;
    }
  }
}

TEST(BatchBalancerSplit, NoRankFallsBelowTheFloor) {
  // A rank 100x slower gets floor(0.25 * 64 / 2) = 8, not 0.
  EXPECT_EQ(BatchBalancer::split(64, {100.0, 1.0}, 0.25), (std::vector<int64_t>{56, 8}));
  // Floor for two slow ranks of three; the fast one takes the rest.
  EXPECT_EQ(BatchBalancer::split(96, {1.0, 100.0, 1.0}, 0.5), (std::vector<int64_t>{16, 64, 16}));
  // min_fraction 1: always even.
  EXPECT_EQ(BatchBalancer::split(64, {3.0, 1.0}, 1.0), (std::vector<int64_t>{32, 32}));
}

TEST(BatchBalancerSplit, InUnitsOfTheGranularity) {
  // 16 units of 8: 10.67 and 5.33 -> 11 and 5 units.
  EXPECT_EQ(BatchBalancer::split(128, {2.0, 1.0}, 0.25, 8), (std::vector<int64_t>{88, 40}));
  EXPECT_EQ(BatchBalancer::split(24, {1.0, 1.0, 1.0}, 0.25, 8), (std::vector<int64_t>{8, 8, 8}));
  EXPECT_THROW(BatchBalancer::split(100, {1.0, 1.0}, 0.25, 8), ContractError);
  EXPECT_THROW(BatchBalancer::split(16, {1.0, 1.0, 1.0}, 0.25, 8), ContractError);
}

TEST(BatchBalancerSplit, PredictedStepIsTheSlowestRanksShare) {
  EXPECT_DOUBLE_EQ(BatchBalancer::predicted_seconds({64, 32}, {1000.0, 500.0}), 0.064);
  EXPECT_DOUBLE_EQ(BatchBalancer::predicted_seconds({48, 48}, {1000.0, 500.0}), 0.096);
  EXPECT_EQ(BatchBalancer::predicted_seconds({48, 48}, {1000.0, 0.0}), 0.0);
}

TEST(BatchBalancerSplit, UnmeasuredRanksCountAsTheSlowest) {
  EXPECT_EQ(BatchBalancer::split(60, {0.0, 0.0}, 0.25), (std::vector<int64_t>{30, 30}));
  EXPECT_EQ(BatchBalancer::split(90, {2.0, 0.0, 1.0}, 0.25), (std::vector<int64_t>{45, 23, 22}));
  EXPECT_THROW(BatchBalancer::split(1, {1.0, 1.0}, 0.25), ContractError);
}

class BatchBalancerRanks : public ::testing::TestWithParam<std::string> {};

BatchBalancerOptions balancer_options(Engine& engine, int64_t global_batch) {
  BatchBalancerOptions o;
  o.engine = &engine;
  o.global_batch = global_batch;
  o.interval = 2;
  return o;
}

// Rank 1 takes twice as long per sample as rank 0: after a rebalance every
// rank holds the same split, 2:1, summing to G, with contiguous offsets, and
// the gradient weights average to 1.
TEST_P(BatchBalancerRanks, FasterRankGetsTheLargerShareOnEveryRank) {
  constexpr int n = 2;
  constexpr int64_t kGlobal = 96;
  EngineWorld world(GetParam(), n);
  std::vector<std::vector<int64_t>> seen(n);
  std::vector<double> weights(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    BatchBalancer balancer(balancer_options(*engine, kGlobal));
    EXPECT_EQ(balancer.batch(), kGlobal / n);  // even until measured
    const double seconds_per_sample = rank == 1 ? 2e-3 : 1e-3;
    bool changed = false;
    for (int step = 0; step < 6; ++step) {
      const bool rebalanced = balancer.record(seconds_per_sample * balancer.batch());
      EXPECT_EQ(rebalanced && step != 1, false) << "only the first rebalance changes the split";
      changed |= rebalanced;
    }
    EXPECT_TRUE(changed);
    EXPECT_EQ(balancer.rebalances(), 3);
    seen[rank] = balancer.batches();
    weights[rank] = balancer.gradient_weight();
    EXPECT_EQ(balancer.offset(), rank == 0 ? 0 : balancer.batches()[0]);
    EXPECT_NEAR(balancer.rates()[0], 1000.0, 1e-6);
    EXPECT_NEAR(balancer.rates()[1], 500.0, 1e-6);
  });
  EXPECT_EQ(seen[0], (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(seen[1], seen[0]);
  EXPECT_DOUBLE_EQ(weights[0] + weights[1], 2.0);
}

// Rank 1 is 3% slower per sample: the proportional split (49/47) would
// shorten the step by 0.9%, less than min_gain 2%, so the split stays even;
// with min_gain 0 it moves. Also in units of 8: 96 = 12 units, 6/6 either way.
TEST_P(BatchBalancerRanks, SmallGainsDoNotMoveTheSplit) {
  constexpr int n = 2;
  EngineWorld world(GetParam(), n);
  std::vector<std::vector<int64_t>> seen(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    const double seconds_per_sample = rank == 1 ? 1.03e-3 : 1e-3;
    for (double min_gain : {0.02, 0.0}) {
      for (int64_t granularity : {int64_t{1}, int64_t{8}}) {
        BatchBalancerOptions o = balancer_options(*engine, 96);
        o.min_gain = min_gain;
        o.granularity = granularity;
        o.name = "balancer/" + std::to_string(min_gain) + "/" + std::to_string(granularity);
        BatchBalancer balancer(o);
        for (int step = 0; step < 4; ++step) balancer.record(seconds_per_sample * balancer.batch());
        EXPECT_EQ(balancer.rebalances(), 2);
        seen[rank].insert(seen[rank].end(), balancer.batches().begin(), balancer.batches().end());
      }
    }
  });
  EXPECT_EQ(seen[0], (std::vector<int64_t>{48, 48, 48, 48, 49, 47, 48, 48}));
  EXPECT_EQ(seen[1], seen[0]);
}

TEST_P(BatchBalancerRanks, DifferentOptionsFailOnEveryRank) {
  constexpr int n = 3;
  EngineWorld world(GetParam(), n);
  std::vector<std::string> messages(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    try {
      BatchBalancer balancer(balancer_options(*engine, rank == 2 ? 48 : 64));
    } catch (const ContractError& e) {
      messages[rank] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(messages[r].find("options.global_batch differs between ranks (from 48 to 64"),
              std::string::npos)
        << "rank " << r << ": " << messages[r];
  }
}

TEST_P(BatchBalancerRanks, InvalidOptionsOnOneRankFailOnEveryRank) {
  constexpr int n = 2;
  EngineWorld world(GetParam(), n);
  std::vector<std::string> messages(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    BatchBalancerOptions o = balancer_options(*engine, 64);
    if (rank == 1) o.smoothing = 1.5;
    try {
      BatchBalancer balancer(o);
    } catch (const ContractError& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_NE(messages[1].find("options.smoothing is 1.5; it must be in (0, 1]"), std::string::npos)
      << messages[1];
  EXPECT_NE(messages[0].find("invalid on another rank"), std::string::npos) << messages[0];
}

TEST_P(BatchBalancerRanks, GlobalBatchBelowTheWorldAndBadTimesAreErrors) {
  constexpr int n = 2;
  EngineWorld world(GetParam(), n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    try {
      BatchBalancer balancer(balancer_options(*engine, 1));
      ADD_FAILURE() << "a global batch of 1 for 2 ranks was accepted";
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("options.global_batch is 1: 1 units of 1 for 2 ranks"),
                std::string::npos)
          << e.what();
    }
    BatchBalancer balancer(balancer_options(*engine, 8));
    EXPECT_THROW(balancer.record(-1.0), ContractError);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchBalancerRanks,
                         ::testing::ValuesIn(testing::engine_backends()));

}  // namespace
}  // namespace kolo
