// The parameter server's protocol state (kolo/core/parameter_server.h): roles,
// the partition by bytes, message checks and the clocks of the three modes.
#include "kolo/core/parameter_server.h"

#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::ps {
namespace {

Config config_with(const std::map<std::string, std::string>& env) {
  return Config::load(map_env(env));
}

TEST(PsRoles, LastRanksServe) {
  Topology t;
  t.size = 5;
  t.rank = 3;
  Roles roles = roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}}));
  EXPECT_EQ(roles.workers, 3);
  EXPECT_TRUE(roles.is_server());
  EXPECT_EQ(roles.server_index(), 0);
  EXPECT_EQ(roles.server_rank(1), 4);
  t.rank = 2;
  EXPECT_FALSE(roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}})).is_server());
}

TEST(PsRoles, NoServersOrNoWorkersIsAClearError) {
  Topology t;
  t.size = 2;
  try {
    roles_from(t, config_with({}));
    FAIL() << "no servers accepted";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("--servers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}})), ContractError);
  EXPECT_THROW(config_with({{"KOLO_PS_SERVERS", "-1"}}), ContractError);
}

// Every element lands on exactly one server, in order, and the servers' bytes
// differ by less than one element's size.
TEST(PsPartition, CoversEveryElementOnceWithEqualBytes) {
  const std::vector<VariableSpec> specs = {{"a", {7, 3}, DType::kF32},
                                           {"b", {5}, DType::kF32},
                                           {"c", {2, 2, 2}, DType::kF64},
                                           {"d", {1}, DType::kF32}};
  for (int servers : {1, 2, 3, 5, 40}) {
    const Partition p = Partition::by_bytes(specs, servers);
    ASSERT_EQ(p.slices.size(), static_cast<size_t>(servers));
    std::vector<std::vector<int>> owner(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) owner[i].assign(specs[i].numel(), -1);
    int64_t total_bytes = 0, most = 0, least = INT64_MAX;
    for (int s = 0; s < servers; ++s) {
      int64_t bytes = 0, numel = 0;
      for (const Slice& slice : p.slices[s]) {
        ASSERT_LT(slice.begin, slice.end);
        for (int64_t e = slice.begin; e < slice.end; ++e) {
          ASSERT_EQ(owner[slice.variable][e], -1) << "element on two servers";
          owner[slice.variable][e] = s;
        }
        bytes += slice.numel() * static_cast<int64_t>(dtype_size(specs[slice.variable].dtype));
        numel += slice.numel();
      }
      EXPECT_EQ(p.shard_numel[s], numel);
      total_bytes += bytes;
      most = std::max(most, bytes);
      least = std::min(least, bytes);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      for (int64_t e = 0; e < specs[i].numel(); ++e) {
        ASSERT_NE(owner[i][e], -1) << specs[i].name << "[" << e << "] on no server";
        if (e > 0) {
          EXPECT_LE(owner[i][e - 1], owner[i][e]) << "slices out of order";
        }
      }
    }
    EXPECT_EQ(total_bytes, 21 * 4 + 5 * 4 + 8 * 8 + 4);
    if (servers <= 5) {
      EXPECT_LE(most - least, 2 * 8) << servers << " servers";
    }
  }
  EXPECT_THROW(Partition::by_bytes(specs, 0), ContractError);
}

TEST(PsMessages, FingerprintSeesNamesShapesDtypes) {
  const std::vector<VariableSpec> a = {{"w", {4, 2}, DType::kF32}};
  EXPECT_EQ(fingerprint(a), fingerprint({{"w", {4, 2}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"v", {4, 2}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"w", {2, 4}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"w", {4, 2}, DType::kF64}}));
}

TEST(PsMessages, HeadersRoundTripAndJunkIsRefused) {
  Header h;
  h.kind = Kind::kPush;
  h.clock = 7;
  h.count = 100;
  h.fingerprint = 42;
  const std::vector<int64_t> words = h.encode();
  ASSERT_EQ(words.size(), static_cast<size_t>(kHeaderWords));
  const Header back = Header::decode(words.data(), "test");
  EXPECT_EQ(back.kind, Kind::kPush);
  EXPECT_EQ(back.clock, 7);
  EXPECT_EQ(back.count, 100);
  EXPECT_EQ(back.fingerprint, 42);
  const int64_t junk[kHeaderWords] = {99, 0, 0, 0, 0, 0};
  EXPECT_THROW(Header::decode(junk, "test"), ContractError);
  const int64_t negative[kHeaderWords] = {3, 0, -5, 0, 0, 0};
  EXPECT_THROW(Header::decode(negative, "test"), ContractError);
}

TEST(PsClocks, SyncServesStepCAfterRoundCMinus1) {
  ServerClocks c(2, Mode::kSync, 0);
  EXPECT_TRUE(c.may_serve_pull(0));
  EXPECT_EQ(c.served_pull(0, 0), 0);
  EXPECT_EQ(c.served_pull(1, 0), 0);
  EXPECT_FALSE(c.pushed(0, 0));
  EXPECT_FALSE(c.may_serve_pull(1));
  EXPECT_TRUE(c.pushed(1, 0));
  c.round_applied();
  EXPECT_TRUE(c.may_serve_pull(1));
  EXPECT_FALSE(c.may_serve_pull(2));
  EXPECT_THROW(c.pushed(0, 3), ContractError);  // not its next step
  EXPECT_EQ(c.stats().updates, 2);
  EXPECT_EQ(c.stats().max_staleness, 0);
}

TEST(PsClocks, SyncRoundWaitsForLiveWorkersWhenAnotherLeaves) {
  // Worker 0 pushes its last step and leaves before worker 1 pushes that
  // step: the round still waits for worker 1 (and then averages both).
  ServerClocks c(2, Mode::kSync, 0);
  EXPECT_FALSE(c.pushed(0, 0));
  c.left(0);
  EXPECT_FALSE(c.round_complete()) << "worker 1 has not pushed step 0";
  EXPECT_TRUE(c.pushed(1, 0));
  EXPECT_EQ(c.round_pushes(), 2);
  c.round_applied();
  // Worker 1 goes on alone.
  EXPECT_TRUE(c.pushed(1, 1));
}

TEST(PsClocks, SspBoundsTheLeadOverTheSlowestLiveWorker) {
  ServerClocks c(2, Mode::kSsp, 1);
  // Worker 0 runs ahead while worker 1 stays at step 0.
  EXPECT_TRUE(c.may_serve_pull(0));
  c.served_pull(0, 0);
  c.pushed(0, 0);
  EXPECT_TRUE(c.may_serve_pull(1));
  EXPECT_EQ(c.served_pull(0, 1), 1);
  c.pushed(0, 1);
  EXPECT_FALSE(c.may_serve_pull(2)) << "2 steps ahead of worker 1";
  c.served_pull(1, 0);
  c.pushed(1, 0);
  EXPECT_TRUE(c.may_serve_pull(2));
  EXPECT_EQ(c.stats().max_staleness, 1);
  EXPECT_EQ(c.stats().counts[1], 1);
  // A worker that left no longer holds anyone back.
  c.served_pull(1, 1);
  c.pushed(0, 2);
  EXPECT_FALSE(c.may_serve_pull(3)) << "worker 1 is still at step 1";
  c.left(1);
  EXPECT_TRUE(c.may_serve_pull(3));
  EXPECT_EQ(c.live_workers(), 1);
  // Worker 1 restarted: it continues from the slowest live worker's step
  // (worker 0's 3), so the bound holds at once, and counts as live again.
  EXPECT_EQ(c.rejoin_clock(1), 3);
  c.rejoined(1, c.rejoin_clock(1));
  EXPECT_EQ(c.live_workers(), 2);
  EXPECT_EQ(c.next_step(1), 3);
  EXPECT_TRUE(c.may_serve_pull(4));
  EXPECT_FALSE(c.may_serve_pull(5));
  c.served_pull(1, 3);
  c.pushed(1, 3);
  EXPECT_EQ(c.stats().worker_updates, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(c.stats().rejoins, (std::vector<int64_t>{0, 1}));
  // With no live worker, a restarted one keeps its own step.
  c.left(0);
  c.left(1);
  EXPECT_EQ(c.rejoin_clock(1), 4);
}

TEST(PsClocks, AsyncNeverWaits) {
  ServerClocks c(3, Mode::kAsync, 0);
  EXPECT_TRUE(c.may_serve_pull(1000));
  EXPECT_THROW(ServerClocks(2, Mode::kSsp, -1), ContractError);
  EXPECT_EQ(parse_mode("ssp", "t"), Mode::kSsp);
  EXPECT_THROW(parse_mode("fast", "t"), ContractError);
}

}  // namespace
}  // namespace kolo::ps
