// metric_average over 1-3 rank-threads and on a process set.
#include "kolo/torch/metrics.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kolo
