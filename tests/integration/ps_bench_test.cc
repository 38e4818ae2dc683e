// The parameter server through kolorun (`kolorun -np W --servers S`), by way
// of `kolo-bench ps` at tiny sizes: the driver starts each configuration's
// workers and servers under kolorun; every mode trains and prints the
// issue's JSON fields. Nothing about speed is asserted; synchronous PS
// reaches the test accuracy allreduce reaches (the same training, up to float
// rounding), and staleness stays within each mode's bound.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "kolorun_harness.h"

namespace {

using kolo::kolorun_test::bench_path;
using kolo::kolorun_test::run_shell;

constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

TEST(PsBench, EveryModeTrainsThroughKolorunWithServers) {
  if (access(bench_path().c_str(), X_OK) != 0 ||
      run_shell("'" + bench_path() + "' ps --help >/dev/null 2>&1").second != 0) {
    GTEST_SKIP() << "kolo-bench has no ps mode (kolo_torch needs libtorch-dev)";
  }
  if (access((std::string(kDataDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << kDataDir << " is missing (Debian package dataset-fashion-mnist)";
  }
  const auto [out, status] = run_shell(
      "timeout 600 '" + bench_path() +
      "' ps --json --models cnn --designs allreduce,ps --modes sync,async,ssp --workers 2 "
      "--servers 2 --max-staleness 1 --epochs 1 --train-subset 640 --test-subset 200 "
      "--batch 32 --lr 0.05 --config-timeout 180");
  ASSERT_EQ(status, 0) << out;
  std::set<std::string> seen;
  std::map<std::string, double> accuracy;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(row.is_discarded()) << "not a JSON row: " << line;
    for (const char* key : {"model", "design", "mode", "workers", "servers", "samples_per_sec",
                            "bytes_per_step", "test_metric", "max_staleness_seen"}) {
      EXPECT_TRUE(row.contains(key)) << key << " missing: " << line;
    }
    const std::string mode = row.at("mode");
    seen.insert(row.at("design").get<std::string>() + "/" + mode);
    EXPECT_GT(row.at("samples_per_sec").get<double>(), 0) << line;
    EXPECT_GT(row.at("bytes_per_step").get<int64_t>(), 0) << line;
    accuracy[row.at("design").get<std::string>() + "/" + mode] = row.at("test_metric");
    EXPECT_GE(row.at("test_metric").get<double>(), 0.0) << line;
    EXPECT_LE(row.at("test_metric").get<double>(), 1.0) << line;
    if (mode == "sync") {
      EXPECT_EQ(row.at("max_staleness_seen"), 0) << line;
    }
    if (mode == "ssp") {
      EXPECT_LE(row.at("max_staleness_seen").get<int>(), 1) << line;
    }
  }
  EXPECT_EQ(seen, (std::set<std::string>{"allreduce/sync", "ps/sync", "ps/async", "ps/ssp"}))
      << out;
  // 200 test images: one image is 0.005.
  EXPECT_NEAR(accuracy["ps/sync"], accuracy["allreduce/sync"], 0.011) << out;
}

// The sparse model (an embedding table and an MLP) at a tiny size: both
// designs train through kolorun, sync PS moves fewer bytes than the
// whole-table allreduce and reaches the same held-out loss (the same
// training: row-wise Adagrad leaves untouched rows as dense Adagrad does).
TEST(PsBench, SparseModelTrainsThroughKolorunWithServers) {
  if (access(bench_path().c_str(), X_OK) != 0 ||
      run_shell("'" + bench_path() + "' ps --help >/dev/null 2>&1").second != 0) {
    GTEST_SKIP() << "kolo-bench has no ps mode (kolo_torch needs libtorch-dev)";
  }
  const auto [out, status] = run_shell(
      "timeout 600 '" + bench_path() +
      "' ps --json --models sparse --designs allreduce,ps --modes sync,async --workers 2 "
      "--servers 2 --rows 20000 --epochs 1 --train-subset 1280 --test-subset 400 --batch 32 "
      "--lr 0.05 --config-timeout 180");
  ASSERT_EQ(status, 0) << out;
  std::map<std::string, nlohmann::json> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(row.is_discarded()) << "not a JSON row: " << line;
    EXPECT_EQ(row.at("model"), "sparse") << line;
    rows[row.at("design").get<std::string>() + "/" + row.at("mode").get<std::string>()] = row;
  }
  ASSERT_EQ(rows.size(), 3u) << out;
  const nlohmann::json& ar = rows["allreduce/sync"];
  const nlohmann::json& sync = rows["ps/sync"];
  EXPECT_LT(sync.at("bytes_per_step").get<int64_t>(), ar.at("bytes_per_step").get<int64_t>() / 10)
      << out;
  EXPECT_NEAR(sync.at("test_metric").get<double>(), ar.at("test_metric").get<double>(), 1e-3)
      << out;
  // Learning: below the initial parameters' held-out loss.
  EXPECT_LT(sync.at("test_metric").get<double>(), sync.at("initial_test_loss").get<double>())
      << out;
  EXPECT_GT(rows["ps/async"].at("samples_per_sec").get<double>(), 0) << out;
}

}  // namespace
