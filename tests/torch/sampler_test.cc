// DistributedSampler: disjoint shards, coverage, padding and dropping, per-epoch
// reshuffle shared by every rank, PyTorch's order, resume, data loader use.
#include "kolo/torch/sampler.h"

#include <gtest/gtest.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo {
namespace {

DistributedSampler make(size_t n, int rank, int size, bool shuffle = true, uint64_t seed = 0,
                        bool drop_last = false) {
  DistributedSamplerOptions o;
  o.rank = rank;
  o.world_size = size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  return DistributedSampler(n, o);
}

// Every rank's indices for one epoch.
std::vector<std::vector<size_t>> shards(size_t n, int size, int64_t epoch, bool drop_last,
                                        uint64_t seed = 3) {
  std::vector<std::vector<size_t>> result;
  for (int r = 0; r < size; ++r) {
    DistributedSampler s = make(n, r, size, true, seed, drop_last);
    s.set_epoch(epoch);
    result.push_back(s.indices());
  }
  return result;
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverEverySampleOnceWhenEven) {
  for (int size : {1, 2, 3, 4}) {
    const size_t n = 12 * 5;
    for (int64_t epoch : {0, 1, 7}) {
      auto all = shards(n, size, epoch, /*drop_last=*/false);
      std::vector<int> seen(n, 0);
      for (const auto& shard : all) {
        EXPECT_EQ(shard.size(), n / size);
        for (size_t i : shard) {
          ASSERT_LT(i, n);
          ++seen[i];
        }
      }
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "sample " << i << " size " << size;
    }
  }
}

TEST(DistributedSampler, UnevenTailIsPaddedWithTheFirstIndicesOfTheOrder) {
  const size_t n = 10;
  const int size = 4;  // 10 = 2 * 4 + 2: two indices of the order are repeated
  auto all = shards(n, size, /*epoch=*/2, /*drop_last=*/false);
  std::map<size_t, int> seen;
  for (const auto& shard : all) {
    EXPECT_EQ(shard.size(), 3u);  // ceil(10 / 4)
    for (size_t i : shard) ++seen[i];
  }
  EXPECT_EQ(seen.size(), n);  // every sample at least once
  int twice = 0;
  for (const auto& [index, count] : seen) {
    EXPECT_GE(count, 1);
    EXPECT_LE(count, 2);
    twice += count == 2;
  }
  EXPECT_EQ(twice, 2);
  // The repeated ones are the first two of the epoch's order: rank 0 and 1
  // took positions 0 and 1, and positions 10 and 11 (their last) repeat them.
  EXPECT_EQ(all[2].back(), all[0].front());
  EXPECT_EQ(all[3].back(), all[1].front());
}

TEST(DistributedSampler, DropLastDropsTheTailAndKeepsSamplesUnique) {
  const size_t n = 10;
  const int size = 4;
  auto all = shards(n, size, /*epoch=*/0, /*drop_last=*/true);
  std::set<size_t> seen;
  for (const auto& shard : all) {
    EXPECT_EQ(shard.size(), 2u);  // floor(10 / 4)
    for (size_t i : shard) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
  }
  EXPECT_EQ(seen.size(), 8u);
}

TEST(DistributedSampler, EpochReshufflesIdenticallyOnEveryRank) {
  const size_t n = 100;
  // Ranks built independently with the same seed agree on the epoch's order:
  // their shards interleave into one permutation.
  auto e1 = shards(n, 3, 1, false);
  auto e1_again = shards(n, 3, 1, false);
  auto e2 = shards(n, 3, 2, false);
  EXPECT_EQ(e1, e1_again);
  EXPECT_NE(e1, e2);
  // A different seed gives a different order.
  EXPECT_NE(shards(n, 3, 1, false, /*seed=*/4), e1);
  // Without shuffle the order is 0..n-1 dealt round robin, every epoch.
  DistributedSampler plain = make(7, 1, 3, /*shuffle=*/false);
  EXPECT_EQ(plain.indices(), (std::vector<size_t>{1, 4, 0}));
  plain.set_epoch(5);
  EXPECT_EQ(plain.indices(), (std::vector<size_t>{1, 4, 0}));
}

TEST(DistributedSampler, MatchesPyTorchDistributedSampler) {
  // Values printed by Python 1.13 (Debian's python3-torch):
  //   DistributedSampler(range(10), num_replicas=3, rank=1, seed=7), set_epoch(2)
  DistributedSampler a = make(10, 1, 3, true, 7);
  a.set_epoch(2);
  EXPECT_EQ(a.indices(), (std::vector<size_t>{5, 6, 1, 0}));
  //   ... rank=2, seed=7, drop_last=True, epoch 0
  DistributedSampler b = make(10, 2, 3, true, 7, true);
  EXPECT_EQ(b.indices(), (std::vector<size_t>{3, 7, 8}));
  //   DistributedSampler(range(2), num_replicas=3, rank=2, shuffle=False)
  DistributedSampler c = make(2, 2, 3, false);
  EXPECT_EQ(c.indices(), (std::vector<size_t>{0}));
}

TEST(DistributedSampler, DoesNotTouchTheGlobalGenerator) {
  torch::manual_seed(11);
  const double expected = torch::rand({1}).item<double>();
  torch::manual_seed(11);
  DistributedSampler s = make(1000, 0, 2, true, 5);
  s.set_epoch(3);
  EXPECT_EQ(torch::rand({1}).item<double>(), expected);
}

TEST(DistributedSampler, NextHandsOutBatchesAndResumesFromAPosition) {
  DistributedSampler s = make(50, 1, 2, true, 9);
  s.set_epoch(4);
  const std::vector<size_t> all = s.indices();
  ASSERT_EQ(all.size(), 25u);
  std::vector<size_t> got;
  auto first = s.next(10);
  ASSERT_TRUE(first.has_value());
  got.insert(got.end(), first->begin(), first->end());
  EXPECT_EQ(s.position(), (SamplerPosition{4, 10}));

  // A new sampler (a resumed run) restored to that position continues there.
  DistributedSampler resumed = make(50, 1, 2, true, 9);
  resumed.set_position(s.position());
  resumed.reset();  // a data loader's reset at the start of its pass keeps it
  while (auto batch = resumed.next(7)) got.insert(got.end(), batch->begin(), batch->end());
  EXPECT_EQ(got, all);
  EXPECT_FALSE(resumed.next(7).has_value());
  // The next pass after the whole epoch starts the next epoch, reshuffled.
  resumed.reset();
  EXPECT_EQ(resumed.position(), (SamplerPosition{5, 0}));
  EXPECT_NE(resumed.indices(), all);
  // A pass cut short rewinds to its epoch's start.
  resumed.next(3);
  resumed.reset();
  EXPECT_EQ(resumed.position(), (SamplerPosition{5, 0}));

  EXPECT_THROW(resumed.set_position({4, 26}), ContractError);
}

TEST(DistributedSampler, SaveAndLoadThroughAnArchive) {
  DistributedSampler s = make(30, 0, 3, true, 1);
  s.set_epoch(2);
  s.next(4);
  torch::serialize::OutputArchive out;
  s.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  torch::serialize::InputArchive in;
  std::istringstream input(bytes.str());
  in.load_from(input);
  DistributedSampler loaded = make(30, 0, 3, true, 1);
  loaded.load(in);
  EXPECT_EQ(loaded.position(), (SamplerPosition{2, 4}));
  EXPECT_EQ(loaded.indices(), s.indices());

  torch::serialize::InputArchive again;
  std::istringstream input2(bytes.str());
  again.load_from(input2);
  DistributedSampler other_rank = make(30, 1, 3, true, 1);
  EXPECT_THROW(other_rank.load(again), ContractError);
}

TEST(DistributedSampler, RejectsBadRankAndSize) {
  EXPECT_THROW(make(10, 3, 3), ContractError);
  EXPECT_THROW(make(10, 0, 0), ContractError);
  DistributedSampler empty = make(0, 0, 2);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_FALSE(empty.next(4).has_value());
}

// A dataset of the numbers 0..n-1, for a real torch data loader.
struct Numbers : torch::data::datasets::Dataset<Numbers, size_t> {
  explicit Numbers(size_t n) : n_(n) {}
  size_t get(size_t index) override { return index; }
  torch::optional<size_t> size() const override { return n_; }
  size_t n_;
};

// Through a torch data loader (which owns its copy of the sampler): each
// pass is one epoch, the ranks' shards cover the set, and the second pass is
// the next epoch's order (the reference sampler's set_epoch(1)), not the
// first pass again.
TEST(DistributedSampler, PlugsIntoATorchDataLoaderAndReshufflesEachPass) {
  const size_t n = 40;
  std::vector<size_t> seen[2];
  for (int rank = 0; rank < 2; ++rank) {
    DistributedSamplerOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.seed = 2;
    auto loader = torch::data::make_data_loader(Numbers(n), DistributedSampler(n, o),
                                                torch::data::DataLoaderOptions().batch_size(6));
    std::vector<size_t> passes[2];
    for (int pass = 0; pass < 2; ++pass) {
      size_t batches = 0;
      for (const std::vector<size_t>& batch : *loader) {
        passes[pass].insert(passes[pass].end(), batch.begin(), batch.end());
        ++batches;
      }
      EXPECT_EQ(batches, 4u);  // 20 samples per rank in batches of 6
      seen[pass].insert(seen[pass].end(), passes[pass].begin(), passes[pass].end());
    }
    DistributedSampler reference(n, o);
    EXPECT_EQ(passes[0], reference.indices());
    reference.set_epoch(1);
    EXPECT_EQ(passes[1], reference.indices());
    EXPECT_NE(passes[0], passes[1]);
  }
  std::vector<size_t> expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = i;
  for (auto& pass : seen) {
    std::sort(pass.begin(), pass.end());
    EXPECT_EQ(pass, expected);
  }
}

}  // namespace
}  // namespace kolo
