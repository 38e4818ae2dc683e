// Notices between kolorun and its ranks through the store (core/src/
// exit_notices.h): early exits fail the world's rendezvous naming the rank,
// and eviction requests reach kolorun once each, in order, with the start
// they are about and their text intact.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exit_notices.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::detail {
namespace {

TEST(LauncherNotices, AnEarlyExitFailsTheRendezvousNamingTheRank) {
  auto store = make_memory_store();
  const auto check = exited_ranks_check(store, /*self=*/0, /*size=*/3);
  EXPECT_NO_THROW(check());
  announce_clean_exit(*store, 2);
  try {
    check();
    FAIL() << "no fault after rank 2 left";
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 exited with code 0"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.failed_ranks(), std::vector<int>{2});
  }
}

TEST(LauncherNotices, EvictionRequestsAreReadOnceInOrder) {
  auto store = make_memory_store();
  int64_t seen = 0;
  EXPECT_TRUE(new_evictions(*store, &seen).empty());
  request_eviction(*store, 1, 0, "parameter server 0 evicted it: it sent nothing for 9.0 s");
  request_eviction(*store, 3, 2, "parameter server 1 evicted it");
  std::vector<EvictionRequest> got = new_evictions(*store, &seen);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].rank, 1);
  EXPECT_EQ(got[0].start, 0);
  EXPECT_EQ(got[0].why, "parameter server 0 evicted it: it sent nothing for 9.0 s");
  EXPECT_EQ(got[1].rank, 3);
  EXPECT_EQ(got[1].start, 2);
  EXPECT_EQ(got[1].why, "parameter server 1 evicted it");
  EXPECT_EQ(seen, 2);
  EXPECT_TRUE(new_evictions(*store, &seen).empty());
  request_eviction(*store, 0, 1, "again");
  got = new_evictions(*store, &seen);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 0);
  EXPECT_EQ(got[0].why, "again");
}

}  // namespace
}  // namespace kolo::detail
