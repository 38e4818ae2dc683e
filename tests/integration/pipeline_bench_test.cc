// `kolo-bench pipeline` end to end at tiny sizes: the driver starts its
// workers under kolorun for every layout and prints its tables; the JSON rows
// carry the bench's fields. Nothing about speed is asserted (the bench's
// numbers are measurements, not test results); the memory verdicts are the
// bench's own accounting of tensor bytes, which do not depend on timing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace {

using kolo::kolorun_test::bench_path;
using kolo::kolorun_test::run_shell;

bool built() {
  // The mode exists only in a kolo-bench built with libtorch.
  return access(bench_path().c_str(), X_OK) == 0 &&
         run_shell("'" + bench_path() + "' pipeline --help 2>&1").second == 0;
}

// A 2-block model small enough for CI; the memory model's accounting is
// 4.0 MiB unsplit (264,320 parameters x 16 bytes: weights, gradients and
// Adam's two moments) and half that per rank split, against a 3 MiB limit.
const std::string kTiny =
    " --blocks 2 --hidden 32 --ffn 64 --batch 16 --steps 1 --warmup-steps 1"
    " --memory-blocks 2 --memory-hidden 64 --memory-ffn 1024 --memory-batch 8"
    " --memory-steps 2 --memory-micro-batches 2 --config-timeout 120";

TEST(PipelineBench, JsonRowsCoverEverySchedulePartAndLayout) {
  if (!built()) GTEST_SKIP() << "kolo-bench has no pipeline mode (kolo_torch needs libtorch-dev)";
  const auto [out, status] = run_shell("timeout 600 '" + bench_path() + "' pipeline --json" +
                                       kTiny + " --micro-batches 1,4 --memory-limit-mib 3");
  ASSERT_EQ(status, 0) << out;
  std::set<std::pair<std::string, int>> bubble;
  std::set<std::string> throughput;
  std::map<std::string, bool> fits;
  std::set<std::pair<std::string, int>> against_torch;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(row.is_discarded()) << "not a JSON row: " << line;
    const std::string table = row.at("table");
    if (table == "bubble") {
      for (const char* key : {"schedule", "stages", "micro_batches", "bubble_fraction", "theory",
                              "samples_per_sec", "peak_activation_bytes"}) {
        EXPECT_TRUE(row.contains(key)) << key << " missing: " << line;
      }
      EXPECT_EQ(row.at("stages"), 2);
      const int m = row.at("micro_batches");
      EXPECT_DOUBLE_EQ(row.at("theory").get<double>(), 1.0 / (m + 1));
      const double bubble_fraction = row.at("bubble_fraction");
      EXPECT_GE(bubble_fraction, 0.0);
      EXPECT_LE(bubble_fraction, 1.0);
      EXPECT_GT(row.at("peak_activation_bytes").get<int64_t>(), 0);
      bubble.insert({row.at("schedule"), m});
    } else if (table == "throughput") {
      throughput.insert(row.at("layout").get<std::string>() + "/" +
                        row.at("schedule").get<std::string>());
    } else if (table == "memory") {
      fits[row.at("layout")] = row.at("fits");
    } else if (table == "torch") {
      // PyTorch's own schedules on the same configuration, under torchrun.
      EXPECT_EQ(row.at("stages"), 2);
      EXPECT_GT(row.at("kolo_samples_per_sec").get<double>(), 0.0) << line;
      if (row.contains("torch_unsupported")) {
        // PyTorch's 1F1B refuses fewer micro-batches than stages.
        EXPECT_EQ(row.at("schedule"), "1f1b") << line;
        EXPECT_LT(row.at("micro_batches").get<int>(), 2) << line;
      } else {
        EXPECT_GT(row.at("torch_samples_per_sec").get<double>(), 0.0) << line;
      }
      against_torch.insert(
          {row.at("schedule").get<std::string>(), row.at("micro_batches").get<int>()});
    } else {
      ADD_FAILURE() << "unknown table: " << line;
    }
  }
  EXPECT_EQ(bubble, (std::set<std::pair<std::string, int>>{
                        {"gpipe", 1}, {"gpipe", 4}, {"1f1b", 1}, {"1f1b", 4}}));
  EXPECT_EQ(throughput, (std::set<std::string>{"1 rank (unsplit)/-", "dp=2/-",
                                               "pp=2 (best m)/gpipe", "pp=2 (best m)/1f1b"}));
  EXPECT_EQ(fits, (std::map<std::string, bool>{{"unsplit", false}, {"pp=2", true}, {"tp=2", true}}))
      << out;
  // The build's interpreter (KOLO_PYTHON, torch >= 2.4 from scripts/setup.sh)
  // runs torch.distributed.pipelining; its rows match kolo's configurations.
  EXPECT_EQ(against_torch, bubble) << out;
}

TEST(PipelineBench, PrintsItsTable) {
  if (!built()) GTEST_SKIP() << "kolo-bench has no pipeline mode (kolo_torch needs libtorch-dev)";
  const auto [out, status] = run_shell("timeout 300 '" + bench_path() + "' pipeline" + kTiny +
                                       " --schedules 1f1b --micro-batches 8 --no-dp --no-torch "
                                       "--memory-limit-mib 0 2>&1");
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Pipeline bubble: 2 MLP blocks"), std::string::npos) << out;
  EXPECT_NE(out.find("bubble per stage"), std::string::npos) << out;
  EXPECT_NE(out.find("theory"), std::string::npos) << out;
  // The target is evaluated (met or not) on the m >= 4p rows.
  EXPECT_NE(out.find("target (2 stages, m >= 4p): 1f1b m=8"), std::string::npos) << out;
  EXPECT_EQ(out.find("Memory per rank"), std::string::npos) << out;
}

}  // namespace
