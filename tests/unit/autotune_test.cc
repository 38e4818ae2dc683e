// Autotuner driven by a synthetic throughput function (simulated time, no
// sleeping): it settles on the best (threshold, cycle time), is not fooled by
// +-30% window noise or one outlier window, logs every trial, and only ever
// hands out valid settings.
#include "engine/autotune.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr double kCycleSeconds = 0.01;

// Bytes/s of a setting: best at 16 MiB and 1 ms; every other threshold and
// every other cycle time at most half as good, so a median of 3 windows with
// +-30% noise (worst 0.65 vs best 0.7) always ranks them right.
double synthetic_throughput(const Autotuner::Params& p) {
  const double gib = 1e9;
  const double threshold_factor =
      p.fusion_threshold_bytes == 16 * kMiB ? 1.0
      : p.fusion_threshold_bytes == 0
          ? 0.05
          : 0.5 -
                0.3 * std::abs(std::log2((p.fusion_threshold_bytes + 1.0) / (16.0 * kMiB))) / 10.0;
  const double cycle_factor = p.cycle_time_ms == 1.0 ? 1.0 : 0.45;
  return gib * threshold_factor * cycle_factor;
}

bool valid(const Autotuner::Params& p, const Autotuner::Options& o) {
  return p.cycle_time_ms >= 0 && p.fusion_threshold_bytes >= 0 &&
         (std::count(o.cycle_times_ms.begin(), o.cycle_times_ms.end(), p.cycle_time_ms) > 0 ||
          p.cycle_time_ms == o.initial.cycle_time_ms) &&
         (std::count(o.fusion_thresholds_bytes.begin(), o.fusion_thresholds_bytes.end(),
                     p.fusion_threshold_bytes) > 0 ||
          p.fusion_threshold_bytes == o.initial.fusion_threshold_bytes);
}

Autotuner::Options fast_options() {
  Autotuner::Options o;
  o.initial = {2.0, 64 * kMiB};  // neither the best threshold nor the best cycle time
  o.warmup_seconds = 0.1;
  o.trial_seconds = kCycleSeconds;  // one cycle per window: every window is one noisy sample
  o.logger = Logger(LogLevel::kWarning, 0);  // quiet unless a test captures it
  return o;
}

// Feeds cycles until the tuner settles (or a generous cap); returns the cycles used.
int drive(Autotuner& tuner, const Autotuner::Options& o, std::mt19937& rng, double noise = 0.3) {
  std::uniform_real_distribution<double> factor(1.0 - noise, 1.0 + noise);
  Autotuner::Params p = tuner.current();
  int cycles = 0;
  for (; cycles < 100000 && !tuner.settled(); ++cycles) {
    EXPECT_TRUE(valid(p, o)) << p.cycle_time_ms << " ms, " << p.fusion_threshold_bytes;
    const double bytes = synthetic_throughput(p) * kCycleSeconds * factor(rng);
    p = tuner.record(static_cast<uint64_t>(bytes), kCycleSeconds);
  }
  return cycles;
}

TEST(Autotuner, SettlesOnTheBestSettingUnderNoise) {
  for (unsigned seed = 1; seed <= 25; ++seed) {
    const Autotuner::Options o = fast_options();
    Autotuner tuner(o);
    std::mt19937 rng(seed);
    drive(tuner, o, rng);
    ASSERT_TRUE(tuner.settled()) << "seed " << seed;
    EXPECT_EQ(tuner.current().fusion_threshold_bytes, 16 * kMiB) << "seed " << seed;
    EXPECT_EQ(tuner.current().cycle_time_ms, 1.0) << "seed " << seed;
    // 7 thresholds at the initial 2 ms, then the 4 other cycle times at 16 MiB.
    EXPECT_EQ(tuner.trials().size(), 11u);
    // Settled means settled: later cycles keep the setting whatever they report.
    for (int i = 0; i < 100; ++i) {
      const auto p = tuner.record(i % 2 ? 0 : 1 << 30, kCycleSeconds);
      EXPECT_EQ(p.fusion_threshold_bytes, 16 * kMiB);
      EXPECT_EQ(p.cycle_time_ms, 1.0);
    }
  }
}

TEST(Autotuner, KeepsTheInitialSettingDuringWarmup) {
  Autotuner::Options o = fast_options();
  o.warmup_seconds = 0.095;  // between 9 and 10 cycles (clear of rounding)
  Autotuner tuner(o);
  for (int i = 0; i < 9; ++i) {
    const auto p = tuner.record(1 << 20, kCycleSeconds);
    EXPECT_EQ(p.fusion_threshold_bytes, o.initial.fusion_threshold_bytes);
    EXPECT_EQ(p.cycle_time_ms, o.initial.cycle_time_ms);
  }
  EXPECT_TRUE(tuner.trials().empty());
  EXPECT_FALSE(tuner.settled());
  tuner.record(1 << 20, kCycleSeconds);  // warm-up over: the first candidate starts
  EXPECT_EQ(tuner.current().fusion_threshold_bytes, o.fusion_thresholds_bytes.front());
}

TEST(Autotuner, OneOutlierWindowDoesNotDecide) {
  // The 128 MiB candidate's first counted window is 3x too fast; the median
  // of its three windows ignores it.
  const Autotuner::Options o = fast_options();
  Autotuner tuner(o);
  Autotuner::Params p = tuner.current();
  bool spiked = false, skipped_switch_cycle = false;
  for (int cycles = 0; cycles < 100000 && !tuner.settled(); ++cycles) {
    double bytes = synthetic_throughput(p) * kCycleSeconds;
    if (p.fusion_threshold_bytes == 128 * kMiB && !spiked) {
      if (skipped_switch_cycle) {
        bytes *= 3;
        spiked = true;
      }
      skipped_switch_cycle = true;  // the cycle after the switch is not counted
    }
    p = tuner.record(static_cast<uint64_t>(bytes), kCycleSeconds);
  }
  ASSERT_TRUE(spiked);
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().fusion_threshold_bytes, 16 * kMiB);
}

TEST(Autotuner, IdleWindowsAreNotCounted) {
  const Autotuner::Options o = fast_options();
  Autotuner tuner(o);
  Autotuner::Params p = tuner.current();
  for (int cycles = 0; cycles < 100000 && !tuner.settled(); ++cycles) {
    // Every other cycle completes nothing (a step boundary, data loading).
    const bool idle = cycles % 2 == 1;
    const double bytes = idle ? 0 : synthetic_throughput(p) * kCycleSeconds;
    p = tuner.record(static_cast<uint64_t>(bytes), kCycleSeconds);
  }
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().fusion_threshold_bytes, 16 * kMiB);
  EXPECT_EQ(tuner.current().cycle_time_ms, 1.0);
  for (const auto& trial : tuner.trials()) {
    EXPECT_GT(trial.bytes, 0u);
    // Idle windows would have halved the measured throughput.
    EXPECT_NEAR(trial.throughput_bytes_per_s, synthetic_throughput(trial.params),
                1e-6 * synthetic_throughput(trial.params) + 200);
  }
}

TEST(Autotuner, LogsEveryWindowTrialAndTheSettledValuesToTheCsv) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kolo_autotune_test_" + std::to_string(::getpid()) + ".csv"))
                               .string();
  Autotuner::Options o = fast_options();
  o.log_path = path;
  {
    Autotuner tuner(o);
    std::mt19937 rng(7);
    drive(tuner, o, rng);
    ASSERT_TRUE(tuner.settled());
  }
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line,
            "event,cycle_time_ms,fusion_threshold_bytes,bytes,seconds,throughput_bytes_per_s");
  int windows = 0, trials = 0, settled = 0;
  std::string settled_line;
  while (std::getline(in, line)) {
    const std::string event = line.substr(0, line.find(','));
    windows += event == "window";
    trials += event == "trial";
    if (event == "settled") {
      ++settled;
      settled_line = line;
    }
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 5) << line;
  }
  EXPECT_EQ(trials, 11);
  EXPECT_EQ(windows, 33);
  EXPECT_EQ(settled, 1);
  EXPECT_EQ(settled_line.rfind("settled,1," + std::to_string(16 * kMiB) + ",", 0), 0u)
      << settled_line;
  std::filesystem::remove(path);
}

TEST(Autotuner, LogsEveryTrialAndTheSettledValuesToStderr) {
  Autotuner::Options o = fast_options();
  o.logger = Logger(LogLevel::kInfo, 0);
  testing::internal::CaptureStderr();
  {
    Autotuner tuner(o);
    std::mt19937 rng(3);
    drive(tuner, o, rng);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  size_t trials = 0;
  for (size_t at = err.find("autotune trial "); at != std::string::npos;
       at = err.find("autotune trial ", at + 1))
    ++trials;
  EXPECT_EQ(trials, 11u) << err;
  EXPECT_NE(err.find("autotune settled after 11 trials: fusion threshold 16 MiB"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("cycle time 1 ms"), std::string::npos) << err;
}

TEST(Autotuner, RejectsInvalidOptionsAndCycles) {
  auto expect_contract = [](Autotuner::Options o, const std::string& fragment) {
    try {
      Autotuner tuner(o);
      ADD_FAILURE() << "expected ContractError mentioning " << fragment;
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  Autotuner::Options o = fast_options();
  o.fusion_thresholds_bytes = {};
  expect_contract(o, "candidate lists");
  o = fast_options();
  o.cycle_times_ms = {1.0, -2.0};
  expect_contract(o, "-2");
  o = fast_options();
  o.trial_seconds = 0;
  expect_contract(o, "trial_seconds");
  o = fast_options();
  o.windows_per_trial = 0;
  expect_contract(o, "windows_per_trial");
  o = fast_options();
  o.log_path = "/nonexistent_kolo_dir/autotune.csv";
  expect_contract(o, "/nonexistent_kolo_dir/autotune.csv");

  Autotuner tuner(fast_options());
  EXPECT_THROW(tuner.record(1, -1.0), ContractError);
  EXPECT_THROW(tuner.record(1, std::nan("")), ContractError);
}

}  // namespace
}  // namespace kolo::detail
