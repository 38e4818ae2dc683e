// In-process replicas under kolorun: 2 processes x 2 replicas each train as
// one process with the whole batch. The check itself is a test of the torch
// tier (tests/torch/mirrored_test.cc, MirroredUnderKolorun), which each
// process runs and which compares its replicas with the single-process
// reference; here kolorun starts it and every process must pass it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

std::string torch_tests_path() { return KOLO_BINARY_DIR "/tests/kolo_torch_tests"; }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(MirroredUnderKolorun, TwoProcessesOfTwoReplicasEqualOneProcess) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r = run_kolorun(
      {"-np", "2", "--timeout", "60", torch_tests_path(), "--gtest_filter=MirroredUnderKolorun.*"},
      seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_of(r.out, "mirrored under kolorun: rank "), 2u) << r.out;
  EXPECT_EQ(count_of(r.out, "2 replicas, shm backend"), 2u) << r.out;
  EXPECT_EQ(count_of(r.out, "[  PASSED  ] 1 test."), 2u) << r.out;
  EXPECT_EQ(count_of(r.out, "SKIPPED"), 0u) << r.out;
}

}  // namespace
}  // namespace kolo::kolorun_test
