#include "engine/autotune.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

enum class Stage { kWarmup, kThresholds, kCycleTimes, kSettled };

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return out.str();
}

std::string describe(const Autotuner::Params& p) {
  std::ostringstream out;
  out << "fusion threshold " << mib(p.fusion_threshold_bytes) << " (" << p.fusion_threshold_bytes
      << " bytes), cycle time " << p.cycle_time_ms << " ms";
  return out.str();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void check_options(const Autotuner::Options& o) {
  const std::string where = "kolo autotune: ";
  if (o.fusion_thresholds_bytes.empty() || o.cycle_times_ms.empty())
    throw ContractError(where + "the candidate lists must not be empty (fusion thresholds: " +
                        std::to_string(o.fusion_thresholds_bytes.size()) +
                        ", cycle times: " + std::to_string(o.cycle_times_ms.size()) + ")");
  for (int64_t t : o.fusion_thresholds_bytes)
    if (t < 0)
      throw ContractError(where + "fusion threshold candidate " + std::to_string(t) +
                          " bytes is negative; use 0 (no fusion) or more");
  for (double c : o.cycle_times_ms)
    if (!(c >= 0) || !std::isfinite(c))
      throw ContractError(where + "cycle time candidate " + std::to_string(c) +
                          " ms is not a finite value >= 0");
  if (o.initial.fusion_threshold_bytes < 0 || !(o.initial.cycle_time_ms >= 0) ||
      !std::isfinite(o.initial.cycle_time_ms))
    throw ContractError(where + "initial setting (" + describe(o.initial) +
                        ") is invalid; thresholds and cycle times must be >= 0");
  if (!(o.warmup_seconds >= 0) || !std::isfinite(o.warmup_seconds))
    throw ContractError(where + "warmup_seconds " + std::to_string(o.warmup_seconds) +
                        " must be a finite value >= 0");
  if (!(o.trial_seconds > 0) || !std::isfinite(o.trial_seconds))
    throw ContractError(where + "trial_seconds " + std::to_string(o.trial_seconds) +
                        " must be a finite value > 0");
  if (o.windows_per_trial < 1)
    throw ContractError(where + "windows_per_trial " + std::to_string(o.windows_per_trial) +
                        " must be at least 1");
}

}  // namespace

struct Autotuner::Impl {
  Options options;
  FILE* csv = nullptr;

  mutable std::mutex mu;
  Stage stage = Stage::kWarmup;
  Params current;
  double warmup_elapsed = 0;
  std::vector<Params> candidates;  // of the current stage
  size_t next_candidate = 0;
  bool skip_cycle = false;  // the cycle after a switch ran with the old setting
  uint64_t window_bytes = 0;
  double window_seconds = 0;
  std::vector<double> scores;  // of the current candidate's counted windows
  uint64_t trial_bytes = 0;
  double trial_seconds = 0;
  std::vector<Trial> trials;
  size_t total_candidates = 0;  // trials the whole search runs

  void csv_row(const char* event, const Params& p, uint64_t bytes, double seconds,
               double throughput) {
    if (csv == nullptr) return;
    std::fprintf(csv, "%s,%g,%lld,%llu,%.6f,%.6g\n", event, p.cycle_time_ms,
                 static_cast<long long>(p.fusion_threshold_bytes),
                 static_cast<unsigned long long>(bytes), seconds, throughput);
    std::fflush(csv);
  }

  void start_candidate(const Params& params) {
    current = params;
    skip_cycle = true;
    window_bytes = 0;
    window_seconds = 0;
    scores.clear();
    trial_bytes = 0;
    trial_seconds = 0;
  }

  // Starts the next candidate of the stage, or the next stage when done.
  void advance() {
    if (next_candidate < candidates.size()) {
      start_candidate(candidates[next_candidate++]);
      return;
    }
    if (stage == Stage::kThresholds) {
      const Params best = best_trial();
      stage = Stage::kCycleTimes;
      candidates.clear();
      next_candidate = 0;
      for (double c : options.cycle_times_ms)
        if (c != best.cycle_time_ms) candidates.push_back({c, best.fusion_threshold_bytes});
      advance();
      return;
    }
    // Cycle times done. Every cycle-time trial used the best threshold, and the
    // best threshold's own trial is among the first stage's, so the best trial
    // overall is the best setting with the chosen threshold.
    current = best_trial();
    stage = Stage::kSettled;
    const Trial* winner = nullptr;
    for (const Trial& t : trials)
      if (t.params.cycle_time_ms == current.cycle_time_ms &&
          t.params.fusion_threshold_bytes == current.fusion_threshold_bytes)
        winner = &t;
    csv_row("settled", current, winner ? winner->bytes : 0, winner ? winner->seconds : 0,
            winner ? winner->throughput_bytes_per_s : 0);
    std::ostringstream line;
    line << "autotune settled after " << trials.size() << " trials: " << describe(current);
    if (winner) line << " (" << winner->throughput_bytes_per_s / 1e9 << " GB/s)";
    options.logger.info(line.str());
  }

  Params best_trial() const {
    const Trial* best = nullptr;
    for (const Trial& t : trials)
      if ((best == nullptr || t.throughput_bytes_per_s > best->throughput_bytes_per_s)) best = &t;
    return best ? best->params : options.initial;
  }

  void finish_window() {
    if (window_bytes > 0) {  // an idle window says nothing about the setting
      const double throughput = static_cast<double>(window_bytes) / window_seconds;
      scores.push_back(throughput);
      trial_bytes += window_bytes;
      trial_seconds += window_seconds;
      csv_row("window", current, window_bytes, window_seconds, throughput);
    }
    window_bytes = 0;
    window_seconds = 0;
    if (static_cast<int>(scores.size()) < options.windows_per_trial) return;

    Trial trial{current, trial_bytes, trial_seconds, median(scores)};
    trials.push_back(trial);
    csv_row("trial", current, trial.bytes, trial.seconds, trial.throughput_bytes_per_s);
    if (csv == nullptr) {
      std::ostringstream line;
      line << "autotune trial " << trials.size() << "/" << total_candidates << ": "
           << describe(current) << ": " << trial.throughput_bytes_per_s / 1e9 << " GB/s (median of "
           << scores.size() << " windows; " << trial.bytes << " bytes in " << trial.seconds
           << " s)";
      options.logger.info(line.str());
    }
    advance();
  }
};

Autotuner::Autotuner(const Options& options) : impl_(std::make_unique<Impl>()) {
  check_options(options);
  Impl& a = *impl_;
  a.options = options;
  a.current = options.initial;
  if (!options.log_path.empty()) {
    a.csv = std::fopen(options.log_path.c_str(), "w");
    if (a.csv == nullptr)
      throw ContractError("kolo autotune: cannot open the log '" + options.log_path +
                          "' for writing (" + std::strerror(errno) +
                          "); set KOLO_AUTOTUNE_LOG to a writable file path, or unset it");
    std::fprintf(a.csv,
                 "event,cycle_time_ms,fusion_threshold_bytes,bytes,seconds,"
                 "throughput_bytes_per_s\n");
    std::fflush(a.csv);
  }
  for (int64_t t : options.fusion_thresholds_bytes)
    a.candidates.push_back({options.initial.cycle_time_ms, t});
  a.total_candidates = a.candidates.size();
  for (double c : options.cycle_times_ms) a.total_candidates += c != options.initial.cycle_time_ms;
}

Autotuner::~Autotuner() {
  if (impl_->csv != nullptr) std::fclose(impl_->csv);
}

Autotuner::Params Autotuner::record(uint64_t bytes, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds))
    throw ContractError("kolo autotune: record() got a cycle of " + std::to_string(seconds) +
                        " seconds; a cycle's duration must be a finite value >= 0");
  Impl& a = *impl_;
  std::lock_guard<std::mutex> lock(a.mu);
  switch (a.stage) {
    case Stage::kSettled:
      break;
    case Stage::kWarmup:
      a.warmup_elapsed += seconds;
      if (a.warmup_elapsed >= a.options.warmup_seconds) {
        a.stage = Stage::kThresholds;
        a.options.logger.info("autotune: warm-up done, trying " +
                              std::to_string(a.candidates.size()) +
                              " fusion thresholds, then the cycle times");
        a.advance();
      }
      break;
    case Stage::kThresholds:
    case Stage::kCycleTimes:
      if (a.skip_cycle) {
        a.skip_cycle = false;
        break;
      }
      a.window_bytes += bytes;
      a.window_seconds += seconds;
      if (a.window_seconds >= a.options.trial_seconds) a.finish_window();
      break;
  }
  return a.current;
}

bool Autotuner::settled() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stage == Stage::kSettled;
}

Autotuner::Params Autotuner::current() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->current;
}

std::vector<Autotuner::Trial> Autotuner::trials() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->trials;
}

}  // namespace kolo::detail
