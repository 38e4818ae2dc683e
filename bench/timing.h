// Timing of collectives across ranks: warm-up, repeat, median; every rank runs
// the same number of iterations and the slowest rank's time counts.
#pragma once

#include <functional>

#include "kolo/core/communicator.h"

namespace kolo::bench {

struct TimingOptions {
  int warmup = 3;        // untimed calls before measuring
  int repeats = 7;       // timed repetitions; the median is reported
  double rep_ms = 20.0;  // target length of one repetition (iterations are batched)
  int max_iters = 2000;  // cap on iterations per repetition
};

// Returns the median over repetitions of the per-call time in microseconds,
// taking the maximum over ranks for each repetition. `sync` must be a working
// communicator of the same ranks (used for barriers and agreeing on the
// iteration count); `op` is the call being measured.
double time_collective_us(Communicator& sync, const std::function<void()>& op,
                          const TimingOptions& options);

}  // namespace kolo::bench
