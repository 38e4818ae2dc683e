// metric_average over 1-3 rank-threads and on a process set; metric_mean's
// exact mean over shards of different sizes.
#include "kolo/torch/metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kolo/core/errors.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::on;
using testing::run_with_engines;

TEST(MetricAverage, AveragesOverTheRanks) {
  for (int n : {1, 2, 3}) {
    std::vector<double> results(n);
    run_with_engines(n, [&](int rank, Engine& engine) {
      const double loss = 0.1 * (rank + 1) + 1e-12 * rank;
      results[rank] = metric_average(loss, "loss", on(engine));
      // Reusing the name for the next value works (every epoch does).
      EXPECT_DOUBLE_EQ(metric_average(rank == 0 ? 1.0 : 0.0, "loss", on(engine)), 1.0 / n);
      EXPECT_THROW(metric_average(1.0, "", on(engine)), ContractError);
    });
    double expected = 0;
    for (int r = 0; r < n; ++r) expected += 0.1 * (r + 1) + 1e-12 * r;
    expected /= n;
    for (int r = 0; r < n; ++r) EXPECT_DOUBLE_EQ(results[r], expected) << "rank " << r;
  }
}

TEST(MetricAverage, OnAProcessSet) {
  run_with_engines(3, [&](int rank, Engine& engine) {
    const int set = engine.add_process_set({1, 2}).id();
    if (rank > 0) {
      CallOptions o = on(engine);
      o.process_set = set;
      EXPECT_DOUBLE_EQ(metric_average(rank * 2.0, "acc", o), 3.0);
    }
    metric_average(0, "done", on(engine));
  });
}

// 10 samples sharded 4 / 3 / 3 over three ranks: the mean over the samples
// is the sum of the ranks' sums over 10, not the mean of the three means.
TEST(MetricMean, IsTheMeanOverEverySampleOfUnequalShards) {
  const std::vector<double> samples = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<std::pair<size_t, size_t>> shards = {{0, 4}, {4, 7}, {7, 10}};
  std::vector<double> means(3), averages(3);
  std::vector<std::string> negative(3), empty(3);
  run_with_engines(3, [&](int rank, Engine& engine) {
    double sum = 0;
    const auto [begin, end] = shards[rank];
    for (size_t i = begin; i < end; ++i) sum += samples[i];
    const auto count = static_cast<int64_t>(end - begin);
    means[rank] = metric_mean(sum, count, "val_loss", on(engine));
    averages[rank] = metric_average(sum / static_cast<double>(count), "val_loss", on(engine));
    negative[rank] = testing::error_of(
        [&] { metric_mean(sum, rank == 2 ? -1 : count, "val_loss", on(engine)); });
    empty[rank] = testing::error_of([&] { metric_mean(0, 0, "val_loss", on(engine)); });
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_DOUBLE_EQ(means[r], 5.5) << "rank " << r;
    EXPECT_DOUBLE_EQ(averages[r], (2.5 + 6.0 + 9.0) / 3) << "rank " << r;  // not 5.5
    EXPECT_NE(negative[r].find("a count is negative on 1 rank(s)"), std::string::npos)
        << negative[r];
    EXPECT_NE(empty[r].find("no rank has a sample"), std::string::npos) << empty[r];
  }
}

}  // namespace
}  // namespace kolo
