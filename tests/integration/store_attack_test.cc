// kolorun's rendezvous store under attack while a job trains (issue 15):
// `kolo-bench store-attack` runs every attack of bench/store_attack.h against
// the store of `kolorun -np 2 fashion_mnist`; kolorun's resident memory stays
// within a few MiB of its size before the attacks and the job goes on
// training. (Before: one frame announced by a peer without the secret grew kolorun
// by the frame's size, and a client that never read its replies without bound.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

std::string example_path() { return KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist"; }

int64_t json_int(const std::string& row, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(row, m, std::regex("\"" + key + "\": (-?[0-9]+)"))) return -1;
  return std::stoll(m[1].str());
}

TEST(StoreAttack, KolorunsMemoryStaysFlatAndTheJobTrainsToItsEnd) {
  if (access(example_path().c_str(), X_OK) != 0 ||
      access((std::string(kDataDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs the fashion_mnist example and dataset-fashion-mnist";
  }
  // A job longer than the test: it must go on training through the attacks
  // (the watchdog SIGKILLs it at the end of the test).
  KolorunProcess job({"-np", "2", example_path(), "--epochs=1000", "--train-subset=1000",
                      "--test-subset=100", "--batch-size=32", "--threads=1", "--progress-lines=1"});
  const auto epochs_done = [](const std::string& out) {
    int done = 0;
    for (size_t at = out.find("Epoch time:"); at != std::string::npos;
         at = out.find("Epoch time:", at + 1)) {
      ++done;
    }
    return done;
  };
  ASSERT_TRUE(job.wait_for_stdout([&](const std::string& out) { return epochs_done(out) >= 1; },
                                  std::chrono::seconds(120)));
  const std::string rows = run_shell(bench_path() + " store-attack --json --seconds 1 --pid " +
                                     std::to_string(job.pid()))
                               .first;
  // Training goes on: two more epochs end after the attacks.
  std::string out_after;
  int at_end = -1;
  ASSERT_TRUE(job.wait_for_stdout(
      [&](const std::string& out) {
        if (at_end < 0) at_end = epochs_done(out);
        out_after = out;
        return epochs_done(out) >= at_end + 2;
      },
      std::chrono::seconds(120)))
      << out_after;
  EXPECT_FALSE(process_gone(job.pid()));

  int attacks = 0;
  std::regex row_pattern("\\{[^\\n]*\\}");
  for (std::sregex_iterator it(rows.begin(), rows.end(), row_pattern), end; it != end; ++it) {
    const std::string row = it->str();
    ++attacks;
    const int64_t idle = json_int(row, "idle_rss_bytes");
    const int64_t peak = json_int(row, "peak_rss_bytes");
    ASSERT_GT(idle, 0) << row;
    EXPECT_GT(json_int(row, "connections"), 0) << row;
    EXPECT_LT(peak - idle, int64_t{8} << 20) << row;
  }
  EXPECT_EQ(attacks, 4) << rows;
}

}  // namespace
}  // namespace kolo::kolorun_test
