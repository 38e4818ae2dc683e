#include "engine/stall_inspector.h"

#include <cstdio>

namespace kolo::detail {

namespace {

StallInspector::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<StallInspector::Clock::duration>(
      std::chrono::duration<double>(s));
}

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", s);
  return text;
}

}  // namespace

StallInspector::StallInspector(Options options, Logger logger)
    : options_(std::move(options)),
      logger_(logger),
      warning_(seconds(options_.warning_seconds)),
      shutdown_(seconds(options_.shutdown_seconds)) {}

std::string StallInspector::ranks_text(const std::vector<int>& set_ranks) const {
  std::string text = set_ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < set_ranks.size(); ++i) {
    const int r = set_ranks[i];
    const int world =
        r < static_cast<int>(options_.world_ranks.size()) ? options_.world_ranks[r] : r;
    text += (i > 0 ? ", " : "") + std::to_string(world);
  }
  return text;
}

std::vector<StallVerdict> StallInspector::inspect(const std::vector<Waiting>& stalled,
                                                  Clock::time_point now) {
  std::vector<StallVerdict> verdicts;
  if (stalled.empty()) {
    warned_ = false;
    return verdicts;
  }
  const std::string where =
      options_.process_set == 0 ? "" : " in process set " + std::to_string(options_.process_set);
  if (!warned_ || now - last_warning_ >= warning_) {
    warned_ = true;
    last_warning_ = now;
    std::string message = "stall: " + std::to_string(stalled.size()) + " request(s)" + where +
                          " submitted by some ranks but not others for " + "more than " +
                          format_seconds(options_.warning_seconds) +
                          " s (KOLO_STALL_WARNING_SECONDS):";
    for (const Waiting& w : stalled) {
      const double waited = std::chrono::duration<double>(now - w.since).count();
      message += "\n  '" + w.name + "' (" + request_kind_name(w.kind) + ", " +
                 format_seconds(waited) + " s): missing " + ranks_text(w.missing) +
                 "; submitted by " + ranks_text(w.submitted);
    }
    if (options_.shutdown_seconds > 0) {
      message += "\n  they fail with RuntimeFault after " +
                 format_seconds(options_.shutdown_seconds) + " s (KOLO_STALL_SHUTDOWN_SECONDS)";
    }
    logger_.warning(message);
  }
  if (options_.shutdown_seconds > 0) {
    for (const Waiting& w : stalled) {
      if (now - w.since < shutdown_) continue;
      StallVerdict v;
      v.name = w.name;
      v.missing.assign(w.missing.begin(), w.missing.end());
      v.waited_seconds = std::chrono::duration<double>(now - w.since).count();
      verdicts.push_back(std::move(v));
    }
  }
  return verdicts;
}

}  // namespace kolo::detail
