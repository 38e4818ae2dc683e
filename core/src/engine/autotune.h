// Autotuning of the engine's fusion threshold and cycle time (KOLO_AUTOTUNE=1)
// (internal).
//
// Rank 0's engine feeds the tuner the bytes its collectives completed and the
// wall time of each cycle; the tuner runs trials (one candidate setting for a
// window of work), scores each by throughput (bytes/s), logs every trial, and
// finally settles on the best setting. The engine ships rank 0's current
// Params to every rank inside the negotiation, so all ranks switch together.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace kolo::detail {

class Autotuner {
 public:
  struct Params {
    double cycle_time_ms = 1.0;
    int64_t fusion_threshold_bytes = 64 << 20;
  };
  struct Options {
    Params initial;
    std::string log_path;      // CSV of trials; "" = only the summary on stderr
    double warmup_seconds = 1.0;  // ignored at the start (first steps are atypical)
    double trial_seconds = 0.5;   // length of one trial's window
  };
  explicit Autotuner(const Options& options);
  ~Autotuner();

  // Called once per engine cycle on rank 0: `bytes` completed in this cycle,
  // `seconds` the cycle's duration (including its sleep). Returns the params
  // to use from the next cycle on.
  Params record(uint64_t bytes, double seconds);
  bool settled() const;
  Params current() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::detail
