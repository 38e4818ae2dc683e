// In-process replicas under kolorun: 2 processes x 2 replicas each train as
// one process with the whole batch, and the example trains with them. The check itself is a test of
// the torch tier (tests/torch/mirrored_test.cc, MirroredUnderKolorun), which each process runs and
// which compares its replicas with the single-process reference; here kolorun starts it and every
// process must pass it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

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

// The example with --strategy mirrored: 2 processes x 2 replicas on a small
// subset learn (a model that learns nothing stays near 0.1).
TEST(MirroredUnderKolorun, FashionMnistExampleTrainsWithReplicas) {
  const std::string example = KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist";
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  if (access(example.c_str(), X_OK) != 0 || access(data.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs " << example << " (libtorch-dev) and " << data
                 << " (dataset-fashion-mnist)";
  }
  const RunResult r =
      run_kolorun({"-np", "2", example, "--strategy", "mirrored", "--replicas", "2", "--threads",
                   "1", "--train-subset", "2000", "--test-subset", "400", "--batch-size", "16",
                   "--epochs", "1", "--progress-lines", "1"},
                  seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Mirrored: 2 process(es) x 2 replica(s) x 1 thread(s)"), std::string::npos)
      << r.out;
  // The Trainer's report: every replica is a worker to it.
  EXPECT_NE(r.out.find("Fashion-MNIST: 4 worker(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Images/sec: "), std::string::npos) << r.out;
  const std::string label = "test accuracy: ";
  const size_t at = r.out.find(label);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_GT(std::stod(r.out.substr(at + label.size())), 0.5) << r.out;
}

}  // namespace
}  // namespace kolo::kolorun_test
