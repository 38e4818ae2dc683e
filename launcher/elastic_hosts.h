// Elastic mode's view of the hosts: the discovery script and the cooldown of
// hosts whose workers failed (docs/elastic.md).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "hosts.h"

namespace kolo::launcher {

// Longest time a failing host is set aside, however often it failed.
constexpr double kMaxCooldownSeconds = 300.0;

// Parses the discovery script's output: one "host:slots" (or "host" = 1 slot)
// per line; blank lines and lines starting with '#' are skipped. Throws
// std::runtime_error naming the bad line (a host named twice, slots < 1...).
std::vector<HostSlots> parse_discovery_output(const std::string& text);

// Runs the script (no arguments, kolorun's environment) and parses its
// stdout. Throws std::runtime_error when it cannot start, exits non-zero (with
// its last stderr line), prints a bad line, or runs longer than `timeout`
// (then it is killed). Reaps only its own process.
std::vector<HostSlots> run_discovery_script(const std::string& path,
                                            std::chrono::milliseconds timeout);

// Hosts set aside after failures: the k-th failure of a host sets it aside for
// base * 2^(k-1) seconds, capped at kMaxCooldownSeconds; afterwards it is
// offered again (its failure count stays, so the next cooldown is longer).
class HostCooldown {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HostCooldown(double base_seconds) : base_seconds_(base_seconds) {}
  // Records a failure at `now`; returns the seconds the host is now set aside.
  double record_failure(const std::string& host, Clock::time_point now);
  bool available(const std::string& host, Clock::time_point now) const;
  int failures(const std::string& host) const;
  // The earliest end of a cooldown after `now`, if any host is cooling down.
  bool next_release(Clock::time_point now, Clock::time_point* when) const;

 private:
  struct Entry {
    int failures = 0;
    Clock::time_point until;
  };
  double base_seconds_;
  std::map<std::string, Entry> hosts_;
};

}  // namespace kolo::launcher
