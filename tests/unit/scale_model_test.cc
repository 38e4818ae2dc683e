// The allreduce cost model of `kolo-bench model` (bench/scale_model.h): the
// bytes each algorithm puts on a host's link, and a fit that recovers the
// parameters that generated its samples.
#include "scale_model.h"

#include <gtest/gtest.h>

#include "kolo/core/errors.h"

namespace kolo::bench {
namespace {

// Only the link term: seconds = bytes over the link / link rate.
CostParams link_only() {
  CostParams p;
  p.link_factor = 1;
  return p;
}

TEST(ScaleModel, AFlatRingCrossesTheLinkWithOneAndAHalfTimesTheHierarchicalBytesAt2x2) {
  const Placement two_by_two{2, 2, 1e6};
  EXPECT_DOUBLE_EQ(allreduce_seconds("flat_ring", 1e6, two_by_two, link_only()), 1.5);
  EXPECT_DOUBLE_EQ(allreduce_seconds("hierarchical", 1e6, two_by_two, link_only()), 1.0);
  // 3 hosts x 2: 2 (n-1)/n = 5/3 against 2 (h-1)/h = 4/3.
  const Placement three_by_two{3, 2, 1e6};
  EXPECT_DOUBLE_EQ(allreduce_seconds("flat_ring", 3e6, three_by_two, link_only()), 5.0);
  EXPECT_DOUBLE_EQ(allreduce_seconds("hierarchical", 3e6, three_by_two, link_only()), 4.0);
  // One host: nothing crosses a link.
  EXPECT_DOUBLE_EQ(allreduce_seconds("hierarchical", 1e6, {1, 8, 1e6}, link_only()), 0.0);
}

TEST(ScaleModel, LatencyCountsRingStepsAndTreeLevels) {
  CostParams p;
  p.alpha_cross = 1;
  p.link_factor = 0;
  EXPECT_DOUBLE_EQ(allreduce_seconds("flat_ring", 4, {2, 2, 1e6}, p), 6);     // 2 (n-1)
  EXPECT_DOUBLE_EQ(allreduce_seconds("hierarchical", 4, {4, 2, 1e6}, p), 6);  // 2 (h-1)
  EXPECT_DOUBLE_EQ(allreduce_seconds("tree", 4, {64, 8, 1e6}, p), 18);        // 2 log2 512
}

TEST(ScaleModel, AnUnknownAlgorithmIsAContractError) {
  EXPECT_THROW(allreduce_seconds("butterfly", 1, {2, 2, 1e6}, {}), ContractError);
}

TEST(ScaleModel, TheFitRecoversTheParametersThatMadeItsSamples) {
  CostParams truth;
  truth.alpha_cross = 200e-6;
  truth.link_factor = 1.1;
  truth.net_per_byte = 1.0 / 2e9;
  truth.alpha_local = 30e-6;
  truth.local_per_byte = 1.0 / 6e9;
  std::vector<AllreduceSample> samples;
  for (double rate : {125e6, 1.25e9, 2.5e9}) {
    for (auto [hosts, ranks] : {std::pair{2, 2}, {3, 2}, {2, 1}}) {
      for (const char* algorithm : {"flat_ring", "hierarchical"}) {
        for (double bytes = 4096; bytes <= 256e6; bytes *= 4) {
          const Placement placement{hosts, ranks, rate};
          samples.push_back({"", algorithm, placement, bytes,
                             allreduce_seconds(algorithm, bytes, placement, truth)});
        }
      }
    }
  }
  double rms = 1;
  const CostParams fitted = fit_cost_params(samples, &rms);
  EXPECT_LT(rms, 1e-6);
  EXPECT_NEAR(fitted.alpha_cross / truth.alpha_cross, 1, 1e-4);
  EXPECT_NEAR(fitted.link_factor / truth.link_factor, 1, 1e-4);
  EXPECT_NEAR(fitted.net_per_byte / truth.net_per_byte, 1, 1e-4);
  EXPECT_NEAR(fitted.alpha_local / truth.alpha_local, 1, 1e-4);
  EXPECT_NEAR(fitted.local_per_byte / truth.local_per_byte, 1, 1e-4);
}

TEST(ScaleModel, NoSamplesIsAContractError) {
  double rms = 0;
  EXPECT_THROW(fit_cost_params({}, &rms), ContractError);
}

}  // namespace
}  // namespace kolo::bench
