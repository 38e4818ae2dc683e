// The parameter server's protocol on a link (torch/src/ps_protocol.h): the
// message checks, and the clocks of the three modes (when a pull may be
// served, and which workers hold it back).
#include "ps_protocol.h"

#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::ps {
namespace {

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

// The workers a waiting pull is held back by: those a server evicts when
// they are silent (PsOptions::evict_after).
TEST(PsClocks, HoldingBackNamesTheWorkersAPullWaitsFor) {
  ServerClocks ssp(3, Mode::kSsp, 1);
  for (int step = 0; step < 3; ++step) ssp.pushed(0, step);
  ssp.pushed(1, 0);
  // A pull for step 3 needs every live worker at >= 2 pushes.
  EXPECT_EQ(ssp.holding_back(3), (std::vector<int>{1, 2}));
  ssp.left(2);
  EXPECT_EQ(ssp.holding_back(3), (std::vector<int>{1}));
  EXPECT_TRUE(ssp.holding_back(2).empty());
  ServerClocks sync(2, Mode::kSync, 0);
  sync.pushed(0, 0);
  EXPECT_EQ(sync.holding_back(1), (std::vector<int>{1}));
  ServerClocks async(2, Mode::kAsync, 0);
  EXPECT_TRUE(async.holding_back(100).empty());
}

}  // namespace
}  // namespace kolo::ps
