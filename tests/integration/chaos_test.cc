// A small chaos run (bench/chaos_bench.h) in CI: `kolo-bench chaos` starts the
// elastic Fashion-MNIST example on 3 workers, SIGKILLs one member and
// SIGSTOPs another (seeded), and requires the job to finish, every round to
// replay bitwise from the state it started from, and nothing (process,
// /dev/shm segment, temporary file) to be left. `kolo-bench chaos` with its
// defaults is the >= 10-fault run of docs/benchmarks.md.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

TEST(Chaos, ASmallRunSurvivesAKillAndAStopAndReplaysBitwise) {
  const std::string example = KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist";
  if (access(example.c_str(), X_OK) != 0) GTEST_SKIP() << example << " is not built";
  if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
    GTEST_SKIP() << "Fashion-MNIST is missing (Debian package dataset-fashion-mnist)";
  }
  const RunResult r = run_program(
      KOLO_BINARY_DIR "/bench/kolo-bench",
      {"chaos", "--workers",        "3",         "--faults",       "2",    "--seed",
       "7",     "--kinds",          "kill,stop", "--min-gap",      "0.5",  "--max-gap",
       "1",     "--epochs",         "1",         "--train-subset", "4800", "--test-subset",
       "200",   "--commit-every",   "5",         "--batch",        "32",   "--timeout",
       "8",     "--stall-shutdown", "2",         "--run-timeout",  "150",  "--json"},
      seconds(280));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::istringstream rows(r.out);
  int faults = 0;
  bool summary = false;
  for (std::string line; std::getline(rows, line);) {
    const auto row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(row.is_discarded()) << line;
    if (row.contains("fault")) {
      ++faults;
      EXPECT_GE(row["recovery_s"].get<double>(), 0) << line;
      EXPECT_GE(row["lost_steps"].get<int>(), 0) << line;
      EXPECT_LE(row["lost_steps"].get<int>(), 5) << "at most one commit interval: " << line;
    } else if (row["kind"] == "all") {
      summary = true;
      EXPECT_EQ(row["faults"].get<int>(), 2) << line;
      EXPECT_TRUE(row["completed"].get<bool>()) << line;
      EXPECT_TRUE(row["replay_equal"].get<bool>()) << line;
      EXPECT_GE(row["replayed_rounds"].get<int>(), 3) << line;
      EXPECT_EQ(row["leftovers"].get<int>(), 0) << line;
    }
  }
  EXPECT_EQ(faults, 2) << r.out;
  EXPECT_TRUE(summary) << r.out << r.err;
  // One of each kind (the first faults cover every kind of --kinds).
  EXPECT_NE(r.out.find("\"kind\":\"SIGKILL\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"kind\":\"SIGSTOP\""), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kolo::kolorun_test
