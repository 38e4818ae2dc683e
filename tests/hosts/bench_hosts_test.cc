// `kolo-bench collectives` across test hosts (scripts/bench_hosts.sh's
// measurement): every cross-host algorithm and the link's TCP rate appear as
// JSON rows that name their placement, link and algorithm. Sizes are tiny:
// this checks the path and the rows, never the speed.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "kolorun_harness.h"
#include "test_hosts.h"

#if KOLO_HAVE_GLOO

namespace kolo::hosts_test {
namespace {

using kolorun_test::run_kolorun;
using kolorun_test::RunResult;
using std::chrono::seconds;

TEST(BenchAcrossHosts, CollectivesRowsNameTheirPlacementLinkAndAlgorithm) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  const std::string bench = std::string(KOLO_BINARY_DIR) + "/bench/kolo-bench";
  RunResult r = run_kolorun({"-H",
                             hosts->names[0] + ":2," + hosts->names[1] + ":2",
                             "--ssh-command",
                             hosts->ssh_command,
                             "--timeout",
                             "60",
                             bench,
                             "collectives",
                             "--ops",
                             "allreduce",
                             "--no-pingpong",
                             "--min-bytes",
                             "4096",
                             "--max-bytes",
                             "65536",
                             "--warmup",
                             "0",
                             "--repeats",
                             "1",
                             "--link",
                             "test-link",
                             "--json"},
                            seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<int> streams;
  std::map<std::string, std::string> algorithm_of;  // label -> algorithm
  std::map<std::string, int> sizes_of;              // label -> allreduce rows
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("hosts"), 2) << line;
    EXPECT_EQ(row.at("ranks_per_host"), 2) << line;
    EXPECT_EQ(row.at("link"), "test-link") << line;
    if (row.at("op") == "link_rate") {
      streams.insert(row.at("streams").get<int>());
      EXPECT_GT(row.at("rate_gbps").get<double>(), 0) << line;
      continue;
    }
    EXPECT_EQ(row.at("op"), "allreduce") << line;
    EXPECT_GT(row.at("time_us").get<double>(), 0) << line;
    algorithm_of[row.at("label")] = row.at("algorithm");
    ++sizes_of[row.at("label")];
  }
  EXPECT_EQ(streams, (std::set<int>{1, 4})) << r.out;
  EXPECT_EQ(algorithm_of["gloo_ring"], "flat_ring") << r.out;
  EXPECT_EQ(algorithm_of["hierarchical"], "hierarchical") << r.out;
  EXPECT_EQ(algorithm_of["gloo_ring_chunked"], "raw_ring_chunked") << r.out;
  for (const auto& [label, count] : sizes_of) EXPECT_EQ(count, 3) << label;  // 4, 16, 64 KiB
}

}  // namespace
}  // namespace kolo::hosts_test

#endif  // KOLO_HAVE_GLOO
