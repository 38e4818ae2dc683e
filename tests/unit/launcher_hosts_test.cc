// Host list parsing and rank placement (launcher/hosts.h).
#include <gtest/gtest.h>

#include "hosts.h"
#include "usage_error.h"

namespace kolo::launcher {
namespace {

std::string error_of(const std::string& list) {
  try {
    parse_host_list(list);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherHosts, ParsesNamesAndSlots) {
  auto hosts = parse_host_list("a:2,b.example.com:3,c,[::1]:4,10.0.0.7:1");
  ASSERT_EQ(hosts.size(), 5u);
  EXPECT_EQ(hosts[0].name, "a");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].name, "b.example.com");
  EXPECT_EQ(hosts[1].slots, 3);
  EXPECT_EQ(hosts[2].name, "c");
  EXPECT_EQ(hosts[2].slots, 1);  // no count: one slot, as in mpirun -H
  EXPECT_EQ(hosts[3].name, "::1");
  EXPECT_EQ(hosts[3].slots, 4);
  EXPECT_EQ(hosts[4].name, "10.0.0.7");
}

TEST(LauncherHosts, MalformedListsNameTheEntry) {
  EXPECT_NE(error_of("a:").find("entry 'a:' has no slot count"), std::string::npos);
  EXPECT_NE(error_of("a:x").find("entry 'a:x' has slot count 'x'"), std::string::npos);
  EXPECT_NE(error_of(":2").find("entry ':2' has no host name"), std::string::npos);
  EXPECT_NE(error_of("a:0").find("has 0 slots"), std::string::npos);
  EXPECT_NE(error_of("a:-1").find("has -1 slots"), std::string::npos);
  EXPECT_NE(error_of("a:2,,b:2").find("entry '' is empty"), std::string::npos);
  EXPECT_NE(error_of("a:2,").find("is empty"), std::string::npos);
  EXPECT_NE(error_of("a:1,A:1").find("named twice"), std::string::npos);
  EXPECT_NE(error_of("").find("-H is empty"), std::string::npos);
  EXPECT_NE(error_of("a:2x").find("'2x'"), std::string::npos);
  // Before: "not a whole number", and "localhost:2:3" was a host named
  // "localhost:2" reached over ssh.
  EXPECT_NE(error_of("host:99999999999").find("slot count 99999999999: too large"),
            std::string::npos)
      << error_of("host:99999999999");
  EXPECT_NE(error_of("localhost:2:3").find("entry 'localhost:2:3' has more than one ':'"),
            std::string::npos)
      << error_of("localhost:2:3");
  EXPECT_NE(error_of("::1:2").find("in brackets, e.g. [::1]:2"), std::string::npos);
}

TEST(LauncherHosts, LocalNames) {
  EXPECT_TRUE(is_local_host("localhost", "node1"));
  EXPECT_TRUE(is_local_host("LOCALHOST", "node1"));
  EXPECT_TRUE(is_local_host("127.0.0.1", "node1"));
  EXPECT_TRUE(is_local_host("127.0.1.1", "node1"));
  EXPECT_TRUE(is_local_host("::1", "node1"));
  EXPECT_TRUE(is_local_host("node1", "node1"));
  EXPECT_TRUE(is_local_host("node1", "node1.cluster.org"));
  EXPECT_TRUE(is_local_host("node1.cluster.org", "node1"));
  EXPECT_FALSE(is_local_host("node2", "node1"));
  EXPECT_FALSE(is_local_host("node1.other.org", "node1.cluster.org"));
  EXPECT_FALSE(is_local_host("10.0.0.1", "node1"));
}

TEST(LauncherHosts, WithoutAHostListEveryRankIsLocal) {
  auto p = assign_ranks({}, 4, "me");  // 4 ranks on 2 cores: oversubscribing is allowed
  ASSERT_EQ(p.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(p[r].rank, r);
    EXPECT_TRUE(p[r].local);
    EXPECT_EQ(p[r].local_rank, r);
    EXPECT_EQ(p[r].local_size, 4);
    EXPECT_EQ(p[r].cross_rank, 0);
    EXPECT_EQ(p[r].cross_size, 1);
  }
}

TEST(LauncherHosts, FillsSlotsInHostOrder) {
  auto p = assign_ranks(parse_host_list("me:2,b:3,c:2"), 6, "me");
  ASSERT_EQ(p.size(), 6u);
  const std::vector<std::string> host = {"me", "me", "b", "b", "b", "c"};
  const std::vector<int> local_rank = {0, 1, 0, 1, 2, 0};
  const std::vector<int> local_size = {2, 2, 3, 3, 3, 1};
  const std::vector<int> cross_rank = {0, 0, 1, 1, 1, 2};
  for (size_t r = 0; r < p.size(); ++r) {
    EXPECT_EQ(p[r].rank, static_cast<int>(r));
    EXPECT_EQ(p[r].host, host[r]);
    EXPECT_EQ(p[r].local, r < 2) << r;
    EXPECT_EQ(p[r].local_rank, local_rank[r]) << r;
    EXPECT_EQ(p[r].local_size, local_size[r]) << r;
    EXPECT_EQ(p[r].cross_rank, cross_rank[r]) << r;
    EXPECT_EQ(p[r].cross_size, 3) << r;
  }
}

TEST(LauncherHosts, HostsWithoutRanksDoNotCount) {
  auto p = assign_ranks(parse_host_list("a:2,b:2"), 2, "me");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].host, "a");
  EXPECT_EQ(p[1].cross_size, 1);
  EXPECT_EQ(assign_ranks(parse_host_list("a:2,b:2"), 0, "me").size(), 4u);  // 0 = every slot
}

TEST(LauncherHosts, LocalhostWithSlotsRunsLocally) {
  auto p = assign_ranks(parse_host_list("localhost:2"), 2, "me");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_TRUE(p[0].local && p[1].local);
  EXPECT_EQ(p[1].local_size, 2);
}

TEST(LauncherHosts, RejectsMoreRanksThanSlotsAndThisHostTwice) {
  try {
    assign_ranks(parse_host_list("a:2,b:2"), 5, "me");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("-np 5 is more than the 4 slots"), std::string::npos);
  }
  EXPECT_THROW(assign_ranks(parse_host_list("localhost:1,me:1"), 2, "me"), UsageError);
}

}  // namespace
}  // namespace kolo::launcher
