// The model-parallel example across two test hosts (test_hosts.h) through
// kolorun over ssh: 2 ranks per host, the hierarchical world (shm within a
// host, gloo between them), a pipeline's stages and tensor-parallel slices
// exchanging activations and gradients point to point and in collectives
// across the hosts' link. Each grid trains (loss falls) and exits 0. Before,
// every rank died: the hierarchical communicator had no point-to-point
// transfers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kolorun_harness.h"
#include "test_hosts.h"

namespace kolo::hosts_test {
namespace {

using kolorun_test::flag_pairs_name;
using kolorun_test::numbers_after;
using kolorun_test::run_kolorun;
using kolorun_test::RunResult;
using std::chrono::seconds;

std::string example_path() { return KOLO_BINARY_DIR "/examples/model_parallel/model_parallel"; }

class ModelParallelAcrossHosts : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ModelParallelAcrossHosts, TrainsOnTwoHostsOfTwo) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  if (access(example_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << example_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  std::vector<std::string> args = {"-H",
                                   hosts->names[0] + ":2," + hosts->names[1] + ":2",
                                   "--ssh-command",
                                   hosts->ssh_command,
                                   "--timeout",
                                   "60",
                                   "-x",
                                   "KOLO_GLOO_IFACE=eth0",
                                   example_path(),
                                   "--blocks",
                                   "2",
                                   "--hidden",
                                   "32",
                                   "--ffn",
                                   "64",
                                   "--batch",
                                   "32",
                                   "--steps",
                                   "40",
                                   "--log-every",
                                   "20",
                                   "--lr",
                                   "0.01"};
  args.insert(args.end(), GetParam().begin(), GetParam().end());
  const RunResult r = run_kolorun(args, seconds(300));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<double> seen = numbers_after(r.out, "loss ");
  ASSERT_EQ(seen.size(), 2u) << r.out;
  EXPECT_LT(seen.back(), seen.front()) << r.out;
}

// dp 2 x pp 2: ranks 0, 1 on the first host; each pipeline's two stages are
// ranks r and r + 2 of the grid (ParallelGrid's order), i.e. across hosts;
// pp 2 x tp 2 puts the tensor-parallel pairs in a host and the stages across.
INSTANTIATE_TEST_SUITE_P(Grids, ModelParallelAcrossHosts,
                         ::testing::Values(std::vector<std::string>{"--dp", "2", "--pp", "2"},
                                           std::vector<std::string>{"--pp", "2", "--tp", "2"}),
                         [](const auto& info) { return flag_pairs_name(info.param); });

}  // namespace
}  // namespace kolo::hosts_test
