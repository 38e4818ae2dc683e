// The model-parallel example end to end through kolorun with 4 workers:
// (dp=2, pp=2) and (tp=2, dp=2) grids of a small MLP-block model; each run
// exits 0, rank 0 of the reporting ranks prints its loss lines, and the loss
// falls over the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

std::string example_path() { return KOLO_BINARY_DIR "/examples/model_parallel/model_parallel"; }

class ModelParallelExample : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ModelParallelExample, TrainsOnFourWorkers) {
  if (access(example_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << example_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  std::vector<std::string> args = {"-np",         "4",       "--timeout", "60",      example_path(),
                                   "--blocks",    "2",       "--hidden",  "32",      "--ffn",
                                   "64",          "--batch", "32",        "--steps", "60",
                                   "--log-every", "20",      "--lr",      "0.01"};
  args.insert(args.end(), GetParam().begin(), GetParam().end());
  const RunResult r = run_kolorun(args, seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<double> seen = numbers_after(r.out, "loss ");
  ASSERT_EQ(seen.size(), 3u) << r.out;
  EXPECT_LT(seen.back(), seen.front()) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Grids, ModelParallelExample,
                         ::testing::Values(std::vector<std::string>{"--dp", "2", "--pp", "2"},
                                           std::vector<std::string>{"--tp", "2", "--dp", "2"}),
                         [](const auto& info) { return flag_pairs_name(info.param); });

}  // namespace
}  // namespace kolo::kolorun_test
