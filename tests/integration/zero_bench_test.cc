// `kolo-bench zero` end to end at tiny sizes: kolo's stage 3 (under kolorun)
// and PyTorch's FSDP2 (under the real torchrun of the build's interpreter) on
// the same model print rows with the same fields, and the memory both hold
// after a step is the 1/N share the sharding promises. Nothing about speed is
// asserted (the bench's numbers are measurements, not test results).
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kolorun_harness.h"

namespace {

using kolo::kolorun_test::bench_path;
using kolo::kolorun_test::run_shell;

bool built() {
  return access(bench_path().c_str(), X_OK) == 0 &&
         run_shell("'" + bench_path() + "' zero --help 2>&1").second == 0;
}

TEST(ZeroBench, StageThreeAndFsdp2RowsHoldTheSameShare) {
  if (!built()) GTEST_SKIP() << "kolo-bench has no zero mode (kolo_torch needs libtorch-dev)";
  // 2 x Linear(64, 64): 8,320 parameters, 33,280 bytes.
  const auto [out, status] =
      run_shell("timeout 600 '" + bench_path() +
                "' zero --json --modes ddp,3,fsdp2 --workers 2 --layers 2 --width 64 --batch 4 "
                "--steps 1 --warmup-steps 1 --config-timeout 240");
  ASSERT_EQ(status, 0) << out;
  std::map<std::string, nlohmann::json> rows;  // by mode (stage 3 with prefetch)
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(row.is_discarded()) << "not a JSON row: " << line;
    if (row.value("prefetch", true)) rows[row.at("mode")] = row;
  }
  ASSERT_TRUE(rows.count("ddp") && rows.count("3") && rows.count("fsdp2")) << out;
  const int64_t model = 2 * 64 * 65 * 4;
  EXPECT_EQ(rows["ddp"].at("param_bytes").get<int64_t>(), model);
  for (const char* mode : {"3", "fsdp2"}) {
    const nlohmann::json& r = rows[mode];
    // Half of every tensor per rank (an odd element count splits unevenly).
    EXPECT_NEAR(r.at("param_bytes").get<double>(), model / 2.0, 8) << mode;
    EXPECT_NEAR(r.at("grad_bytes").get<double>(), model / 2.0, 8) << mode;
    EXPECT_NEAR(r.at("optimizer_state_bytes").get<double>(), model, 16) << mode;
    // Gathered for its forward and backward: at least one whole unit more.
    EXPECT_GE(r.at("peak_param_bytes").get<int64_t>(),
              r.at("param_bytes").get<int64_t>() + r.at("largest_unit_bytes").get<int64_t>() / 2)
        << mode;
    EXPECT_GT(r.at("step_ms").get<double>(), 0.0) << mode;
    EXPECT_GT(r.at("peak_rss_bytes").get<int64_t>(), r.at("start_rss_bytes").get<int64_t>());
  }
}

}  // namespace
