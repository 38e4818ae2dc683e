// Ranks as threads: Communicator::allreduce_segments (tensor fusion without a
// fusion buffer) on shm equals allreduce of the segments' concatenation, for
// both of shm's schemes (gather below 128 KiB, reduce-scatter above), across
// chunk boundaries, in place and not, with segments cut differently on each
// rank; argument errors reach every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::run_ranks;
using testing::run_ranks_catching;

constexpr milliseconds kTimeout{60000};

std::string unique_prefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return "kolo-test-segments-" + std::to_string(getpid()) + "-" + what + "-" +
         std::to_string(counter++);
}

struct ShmWorld {
  ShmWorld(int size, int64_t chunk_bytes)
      : size(size),
        chunk_bytes(chunk_bytes),
        store(make_memory_store()),
        prefix(unique_prefix(std::to_string(size))) {}
  std::unique_ptr<Communicator> connect(int rank) const {
    CommunicatorOptions options;
    options.rank = rank;
    options.size = size;
    options.store = store;
    options.prefix = prefix;
    options.timeout = kTimeout;
    options.shm_chunk_bytes = chunk_bytes;
    return make_communicator("shm", options);
  }
  int size;
  int64_t chunk_bytes;
  std::shared_ptr<Store> store;
  std::string prefix;
};

// Element i of rank r's input: small integers, exact in f32 sums.
float input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13) - 5);
}

// Cuts `total` elements into segments whose sizes follow `pattern` (repeated;
// zeros included), the last one taking the rest.
std::vector<size_t> cut(size_t total, const std::vector<size_t>& pattern) {
  std::vector<size_t> counts;
  size_t used = 0;
  for (size_t k = 0; used < total; ++k) {
    const size_t c = std::min(pattern[k % pattern.size()], total - used);
    counts.push_back(c);
    used += c;
  }
  counts.push_back(0);  // a trailing empty segment
  return counts;
}

struct Case {
  int size;
  size_t total;         // elements
  int64_t chunk_bytes;  // shm pipeline chunk
};

class Segments : public ::testing::TestWithParam<Case> {};

// Every rank cuts the same vector differently (the contract checks only the
// total), half the segments in place; average with scale factors.
TEST_P(Segments, EqualsAllreduceOfTheConcatenation) {
  const Case c = GetParam();
  ShmWorld world(c.size, c.chunk_bytes);
  std::vector<std::string> failures(c.size);
  run_ranks(c.size, [&](int rank) {
    auto comm = world.connect(rank);
    ASSERT_TRUE(comm->native_segments());
    const std::vector<std::vector<size_t>> patterns = {
        {1000, 0, 7, 70000}, {3, 65536, 0, 1}, {4096}, {131072, 5}};
    const std::vector<size_t> counts = cut(c.total, patterns[rank % patterns.size()]);
    std::vector<std::vector<float>> ins(counts.size()), outs(counts.size());
    std::vector<AllreduceSegment> segments;
    size_t at = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      ins[k].resize(counts[k]);
      for (size_t i = 0; i < counts[k]; ++i) ins[k][i] = input(rank, at + i);
      const bool in_place = k % 2 == 0;
      if (!in_place) outs[k].assign(counts[k], -1.0f);
      float* in = ins[k].data();
      segments.push_back({in, in_place ? in : outs[k].data(), counts[k]});
      at += counts[k];
    }
    AllreduceOptions options;
    options.op = ReduceOp::kAverage;
    options.prescale = 2.0;
    options.postscale = 0.5;
    comm->allreduce_segments(segments, DType::kF32, options);

    at = 0;
    for (size_t k = 0; k < counts.size() && failures[rank].empty(); ++k) {
      const float* got = k % 2 == 0 ? ins[k].data() : outs[k].data();
      for (size_t i = 0; i < counts[k]; ++i) {
        double expected = 0;
        for (int r = 0; r < c.size; ++r) expected += input(r, at + i);
        expected = expected / c.size;  // prescale 2 and postscale 0.5 cancel
        if (std::fabs(got[i] - expected) > 1e-5 * (1 + std::fabs(expected))) {
          failures[rank] = "rank " + std::to_string(rank) + " element " + std::to_string(at + i) +
                           ": got " + std::to_string(got[i]) + ", expected " +
                           std::to_string(expected);
          break;
        }
      }
      at += counts[k];
    }
    // The communicator stays in step with plain collectives afterwards.
    float one = 1;
    comm->allreduce(&one, &one, 1, DType::kF32, AllreduceOptions{});
    EXPECT_EQ(one, static_cast<float>(c.size));
  });
  for (const std::string& f : failures) EXPECT_TRUE(f.empty()) << f;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "n" + std::to_string(info.param.size) + "_count" + std::to_string(info.param.total) +
         "_chunk" + std::to_string(info.param.chunk_bytes);
}

INSTANTIATE_TEST_SUITE_P(Shm, Segments,
                         ::testing::Values(Case{1, 5000, 262144}, Case{2, 0, 262144},
                                           Case{2, 3, 262144},
                                           Case{2, 20000, 262144},    // gather scheme, one chunk
                                           Case{2, 20000, 4096},      // gather scheme, many chunks
                                           Case{2, 1000003, 262144},  // reduce-scatter scheme
                                           Case{3, 300007, 65536},  // odd world size, uneven pieces
                                           Case{4, 1 << 20, 262144}),
                         case_name);

TEST(SegmentsErrors, TotalCountMismatchFailsEveryRank) {
  constexpr int n = 3;
  ShmWorld world(n, 262144);
  const auto errors = run_ranks_catching(n, [&](int rank) {
    auto comm = world.connect(rank);
    std::vector<float> a(10, 1.0f), b(rank == 2 ? 6 : 5, 1.0f);
    comm->allreduce_segments({{a.data(), a.data(), a.size()}, {b.data(), b.data(), b.size()}},
                             DType::kF32, AllreduceOptions{});
  });
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank << " did not fail";
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const ContractError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("count"), std::string::npos) << what;
      EXPECT_NE(what.find("15"), std::string::npos) << what;
      EXPECT_NE(what.find("16"), std::string::npos) << what;
    }
  }
}

TEST(SegmentsErrors, NullSegmentOnOneRankFailsEveryRankAndLeavesItUsable) {
  constexpr int n = 2;
  ShmWorld world(n, 262144);
  std::vector<std::string> messages(n);
  run_ranks(n, [&](int rank) {
    auto comm = world.connect(rank);
    std::vector<float> a(8, 1.0f);
    std::vector<AllreduceSegment> segments = {
        {a.data(), a.data(), 4}, {rank == 1 ? nullptr : a.data() + 4, a.data() + 4, 4}};
    try {
      comm->allreduce_segments(segments, DType::kF32, AllreduceOptions{});
    } catch (const ContractError& e) {
      messages[rank] = e.what();
    }
    comm->allreduce(a.data(), a.data(), a.size(), DType::kF32, AllreduceOptions{});
    EXPECT_EQ(a[0], static_cast<float>(n));
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(messages[rank].find("null"), std::string::npos)
        << "rank " << rank << ": " << messages[rank];
  }
}

TEST(SegmentsErrors, BackendsWithoutNativeSegmentsSaySo) {
  auto comms = make_thread_communicators(1, kTimeout);
  EXPECT_FALSE(comms[0]->native_segments());
  float x = 1;
  try {
    comms[0]->allreduce_segments({{&x, &x, 1}}, DType::kF32, AllreduceOptions{});
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("native_segments"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo
