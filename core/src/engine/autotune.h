// Autotuning of the engine's fusion threshold and cycle time (KOLO_AUTOTUNE=1)
// (internal).
//
// Rank 0's engine feeds the tuner the bytes its collectives completed and the
// wall time of each cycle; the tuner runs trials (one candidate setting for a
// window of work), scores each by throughput (bytes/s), logs every trial, and
// finally settles on the best setting. The engine ships rank 0's current
// Params to every rank inside the negotiation, so all ranks switch together.
//
// Search (coordinate descent, as Horovod's first tuner): after the warm-up,
// every fusion threshold candidate at the initial cycle time, then every cycle
// time candidate at the best threshold. A candidate's score is the median
// throughput of `windows_per_trial` windows (each at least trial_seconds long;
// windows that completed no bytes are not counted), which keeps one noisy
// window (+-30%) from deciding. The first cycle after a switch still ran with
// the previous setting and is skipped. The initial setting is measured like
// any candidate, so the tuner never settles on something worse than measured.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "log.h"

namespace kolo::detail {

class Autotuner {
 public:
  struct Params {
    double cycle_time_ms = 1.0;
    int64_t fusion_threshold_bytes = 64 << 20;
  };
  struct Options {
    Params initial;
    std::string log_path;         // CSV of trials; "" = only the summary on stderr
    double warmup_seconds = 1.0;  // ignored at the start (first steps are atypical)
    double trial_seconds = 0.5;   // length of one trial's window
    int windows_per_trial = 3;    // the median of these scores a candidate
    std::vector<int64_t> fusion_thresholds_bytes = {0,        1 << 20,  4 << 20,  16 << 20,
                                                    32 << 20, 64 << 20, 128 << 20};
    std::vector<double> cycle_times_ms = {0.0, 0.5, 1.0, 2.0, 5.0};
    // Trials (when log_path is "") and the settled values go here at info
    // level; KOLO_AUTOTUNE asked for them, so the engine passes a logger whose
    // level is at least info.
    Logger logger{LogLevel::kInfo, 0};
  };
  // One scored candidate.
  struct Trial {
    Params params;
    uint64_t bytes = 0;                 // over its counted windows
    double seconds = 0;                 // over its counted windows
    double throughput_bytes_per_s = 0;  // median over its windows
  };
  // Throws ContractError for invalid options (no candidates, negative times or
  // thresholds, windows_per_trial < 1) or a log_path that cannot be written.
  explicit Autotuner(const Options& options);
  ~Autotuner();

  // Called once per engine cycle on rank 0: `bytes` completed in this cycle,
  // `seconds` the cycle's duration (including its sleep). Returns the params
  // to use from the next cycle on (always a valid setting: cycle time >= 0,
  // threshold >= 0). Negative or non-finite seconds are a ContractError.
  Params record(uint64_t bytes, double seconds);
  bool settled() const;
  Params current() const;
  // Scored candidates so far, in the order they were tried.
  std::vector<Trial> trials() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::detail
