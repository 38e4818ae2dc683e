// The hierarchical communicator (core/src/comm/hierarchical_communicator.h),
// ranks as threads: every collective x dtype x op (the check matrix, against
// the double-precision reference, whose inputs keep every partial sum exact
// so that any reduction order gives the flat path's result bit for bit) on 2
// hosts x 1, 2 and 3 ranks, with ranks placed by slot and round-robin. Parts
// are thread communicators (fast), and in one case the real composition of
// shm and gloo through make_communicator with fake host assignments.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "collective_check.h"
#include "comm/hierarchical_communicator.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "p2p_check.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::run_ranks;

constexpr milliseconds kTimeout{90000};

// Host of each rank: by slot (0,0,1,1,...) or round-robin (0,1,0,1,...).
std::vector<int> placement(int hosts, int per_host, bool round_robin) {
  std::vector<int> host_of;
  for (int r = 0; r < hosts * per_host; ++r) {
    host_of.push_back(round_robin ? r % hosts : r / per_host);
  }
  return host_of;
}

// One hierarchical communicator per rank, its parts thread communicators.
class ThreadHierarchy {
 public:
  // chunk_bytes: HierarchicalParts::pipeline_chunk_bytes (the default when < 0).
  explicit ThreadHierarchy(const std::vector<int>& rank_hosts, long chunk_bytes = -1)
      : layout_(detail::host_layout(rank_hosts)), chunk_bytes_(chunk_bytes) {
    const int hosts = static_cast<int>(layout_.members_of_host.size());
    const int per_host = static_cast<int>(layout_.members_of_host.front().size());
    flat_ = make_thread_communicators(static_cast<int>(rank_hosts.size()), kTimeout);
    for (int h = 0; h < hosts; ++h) local_.push_back(make_thread_communicators(per_host, kTimeout));
    for (int l = 0; l < per_host; ++l) cross_.push_back(make_thread_communicators(hosts, kTimeout));
  }

  std::unique_ptr<Communicator> take(int rank) {
    detail::HierarchicalParts parts;
    parts.rank = rank;
    parts.layout = layout_;
    const int h = layout_.host_of[rank];
    const int l = layout_.local_index[rank];
    parts.local = std::move(local_[h][l]);
    parts.cross = std::move(cross_[l][h]);
    parts.flat = std::move(flat_[rank]);
    parts.prefix = "threads";
    parts.timeout = kTimeout;
    if (chunk_bytes_ >= 0) parts.pipeline_chunk_bytes = static_cast<size_t>(chunk_bytes_);
    return detail::make_hierarchical_communicator(std::move(parts));
  }

 private:
  detail::HostLayout layout_;
  long chunk_bytes_;
  std::vector<std::unique_ptr<Communicator>> flat_;
  std::vector<std::vector<std::unique_ptr<Communicator>>> local_;
  std::vector<std::vector<std::unique_ptr<Communicator>>> cross_;
};

void expect_matrix_passes(const std::vector<int>& rank_hosts, const testing::CheckMatrix& matrix,
                          long chunk_bytes = -1) {
  ThreadHierarchy hierarchy(rank_hosts, chunk_bytes);
  const int n = static_cast<int>(rank_hosts.size());
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(hierarchy.take(r));
  std::vector<std::vector<std::string>> failures(n);
  run_ranks(n,
            [&](int rank) { failures[rank] = testing::check_collectives(*comms[rank], matrix); });
  for (int r = 0; r < n; ++r) {
    for (const auto& line : failures[r]) ADD_FAILURE() << "rank " << r << ": " << line;
  }
}

class HierarchicalMatrix : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(HierarchicalMatrix, EveryCollectiveDtypeAndOpMatchesTheReference) {
  const auto [per_host, round_robin] = GetParam();
  testing::CheckMatrix matrix;
  matrix.counts = {0, 1, 2, 7, 1000, 4099};
  expect_matrix_passes(placement(2, per_host, round_robin), matrix);
}

INSTANTIATE_TEST_SUITE_P(TwoHosts, HierarchicalMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "PerHost" +
                                  (std::get<1>(info.param) ? "RoundRobin" : "BySlot");
                         });

TEST(Hierarchical, ThreeHostsOfTwo) {
  testing::CheckMatrix matrix;
  matrix.counts = {0, 5, 1000};
  expect_matrix_passes(placement(3, 2, false), matrix);
}

// A mismatch across hosts (rank 3 on the second host passes another count)
// is the same ContractError on every rank, and the communicator stays usable.
TEST(Hierarchical, AMismatchIsEveryRanksContractError) {
  ThreadHierarchy hierarchy(placement(2, 2, false));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 4; ++r) comms.push_back(hierarchy.take(r));
  std::vector<std::string> errors(4);
  run_ranks(4, [&](int rank) {
    std::vector<float> data(8, 1.0f);
    try {
      comms[rank]->allreduce(data.data(), data.data(), rank == 3 ? 7 : 8, DType::kF32, {});
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
    comms[rank]->allreduce(data.data(), data.data(), 8, DType::kF32, {});
    EXPECT_EQ(data[0], 4.0f);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("count differs across ranks"), std::string::npos) << errors[r];
    EXPECT_EQ(errors[r], errors[0]);
  }
}

// Point to point on the composition (a pipeline's stages across hosts):
// every pattern of the shared check, within a host (the local part) and
// across hosts (the flat part), placed by slot and round-robin. Before, the
// hierarchical communicator had no point-to-point transfers at all.
TEST(Hierarchical, PointToPointWithinAndAcrossHosts) {
  for (bool round_robin : {false, true}) {
    ThreadHierarchy hierarchy(placement(2, 2, round_robin));
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < 4; ++r) comms.push_back(hierarchy.take(r));
    testing::P2PCheck check;
    check.counts = {0, 1, 1000, 70000};
    std::vector<std::vector<std::string>> failures(4);
    run_ranks(
        4, [&](int rank) { failures[rank] = testing::check_point_to_point(*comms[rank], check); });
    for (int r = 0; r < 4; ++r) {
      for (const auto& line : failures[r]) ADD_FAILURE() << "rank " << r << ": " << line;
    }
  }
}

// A transfer whose two sides disagree names the part and stays that
// transfer's error: both ranks get it, the next transfer works.
TEST(Hierarchical, APointToPointMismatchNamesThePartAndLeavesItUsable) {
  ThreadHierarchy hierarchy(placement(2, 2, false));  // hosts {0, 1} and {2, 3}
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 4; ++r) comms.push_back(hierarchy.take(r));
  std::vector<std::string> errors(4);
  run_ranks(4, [&](int rank) {
    if (rank == 1) return;
    const int peer = rank == 0 ? 2 : rank == 2 ? 0 : -1;  // across hosts
    if (peer < 0) return;
    std::vector<float> data(16, 1.0f);
    P2POptions o;
    o.tag = 3;
    try {
      if (rank == 0) comms[rank]->send(data.data(), 16, DType::kF32, peer, o);
      if (rank == 2) comms[rank]->recv(data.data(), 15, DType::kF32, peer, o);
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
    if (rank == 0) comms[rank]->send(data.data(), 16, DType::kF32, peer, o);
    if (rank == 2) comms[rank]->recv(data.data(), 16, DType::kF32, peer, o);
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("in the flat part"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("16"), std::string::npos) << errors[r];
  }
}

TEST(Hierarchical, WhenTheCompositionIsChosen) {
  CommunicatorOptions o;
  o.size = 4;
  o.hierarchical = "auto";
  EXPECT_FALSE(detail::wants_hierarchy(o));  // hosts unknown
  o.rank_hosts = {0, 0, 1, 1};
  EXPECT_TRUE(detail::wants_hierarchy(o));
  o.rank_hosts = {5, 5, 5, 5};
  EXPECT_FALSE(detail::wants_hierarchy(o));  // one host
  o.size = 2;
  o.rank_hosts = {0, 1};
  EXPECT_FALSE(detail::wants_hierarchy(o));  // one rank per host: nothing to gain
  o.hierarchical = "on";
  EXPECT_TRUE(detail::wants_hierarchy(o));
  o.size = 3;
  o.rank_hosts = {0, 0, 1};
  o.hierarchical = "auto";
  EXPECT_FALSE(detail::wants_hierarchy(o));  // uneven: flat
  o.hierarchical = "on";
  try {
    detail::wants_hierarchy(o);
    ADD_FAILURE() << "uneven hosts with KOLO_HIERARCHICAL=on must be refused";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("the 2 hosts have 2, 1"), std::string::npos) << e.what();
  }
  o.hierarchical = "off";
  EXPECT_FALSE(detail::wants_hierarchy(o));
}

#if KOLO_HAVE_GLOO
// Pipelined allreduce (tiny chunks, so that every count above a few elements
// runs in 2..8 chunks, some ending mid-slice): the same results as whole.
TEST(Hierarchical, PipelinedChunksMatchTheReference) {
  testing::CheckMatrix matrix;
  matrix.counts = {1, 2, 7, 1000, 4099};
  expect_matrix_passes(placement(2, 2, false), matrix, /*chunk_bytes=*/64);
  expect_matrix_passes(placement(3, 2, true), matrix, /*chunk_bytes=*/1000);
  expect_matrix_passes(placement(2, 3, false), matrix, /*chunk_bytes=*/4);
}

// The real composition: make_communicator("gloo") with two fake hosts builds
// shm within each and gloo across them.
TEST(Hierarchical, ShmAndGlooThroughMakeCommunicator) {
  static std::atomic<int> counter{0};
  const std::string prefix =
      "kolo-test-" + std::to_string(getpid()) + "-hier-" + std::to_string(counter++);
  auto store = make_memory_store();
  std::vector<std::vector<std::string>> failures(4);
  std::vector<std::string> backends(4);
  run_ranks(4, [&](int rank) {
    CommunicatorOptions o;
    o.rank = rank;
    o.size = 4;
    o.store = store;
    o.prefix = prefix;
    o.timeout = kTimeout;
    o.hierarchical = "auto";
    o.rank_hosts = {0, 0, 1, 1};
    o.host_name = rank < 2 ? "fake-a" : "fake-b";
    auto comm = make_communicator("gloo", o);
    backends[rank] = comm->backend();
    testing::CheckMatrix matrix;
    matrix.counts = {0, 3, 1000, (size_t{1} << 18) + 1};
    failures[rank] = testing::check_collectives(*comm, matrix);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(backends[r], "gloo");
    for (const auto& line : failures[r]) ADD_FAILURE() << "rank " << r << ": " << line;
  }
}
#endif

}  // namespace
}  // namespace kolo
