// Stall inspector (internal): finds requests that some ranks of a process set
// submitted and others did not, warns about them, and eventually fails them.
//
// Runs on set rank 0 only, which sees every rank's uncached requests in its
// message table (controller.h). Requests waiting in the cached fast path are
// invisible to it, so the controller sends any request pending locally for
// longer than report_after() (half the warning time) through full negotiation.
//  - after KOLO_STALL_WARNING_SECONDS: logs one warning listing each waiting
//    tensor, its op, the ranks that submitted it and the ranks missing
//    (repeated at most once per warning period while the stall lasts);
//  - after KOLO_STALL_SHUTDOWN_SECONDS (> 0): returns a verdict per tensor,
//    which rank 0 ships in the next negotiation, so every rank fails its
//    handle for it with RuntimeFault at the same point (controller.h).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/message.h"
#include "log.h"

namespace kolo::detail {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    double warning_seconds = 60;
    double shutdown_seconds = 600;  // 0 = never fail
    int process_set = 0;
    std::vector<int> world_ranks;  // of the set, for messages
  };
  struct Waiting {
    std::string name;
    RequestKind kind = RequestKind::kAllreduce;
    Clock::time_point since;     // entered rank 0's table
    std::vector<int> submitted;  // set ranks
    std::vector<int> missing;    // set ranks
  };

  StallInspector(Options options, Logger logger);

  // Requests that have waited this long are old enough to look at.
  Clock::duration warning_after() const { return warning_; }
  // Local requests pending this long in the cached path are sent through full
  // negotiation so that rank 0 can see them.
  Clock::duration report_after() const { return warning_ / 2; }

  // `stalled`: the waiting requests older than warning_after(), oldest first.
  // Logs the warning when due; returns the verdicts for requests older than
  // the shutdown time (the caller must not pass a request again once it got a
  // verdict).
  std::vector<StallVerdict> inspect(const std::vector<Waiting>& stalled, Clock::time_point now);

  // "ranks 1, 3" in world ranks.
  std::string ranks_text(const std::vector<int>& set_ranks) const;

 private:
  Options options_;
  Logger logger_;
  Clock::duration warning_;
  Clock::duration shutdown_;
  Clock::time_point last_warning_{};
  bool warned_ = false;
};

}  // namespace kolo::detail
