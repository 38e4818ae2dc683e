// Discovery script and host cooldown (elastic_hosts.h).
#include "elastic_hosts.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "spawn.h"
#include "supervisor.h"
#include "worker_env.h"

namespace kolo::launcher {

std::vector<HostSlots> parse_discovery_output(const std::string& text) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t\r");
    const std::string entry = line.substr(first, last - first + 1);
    HostSlots h;
    const size_t colon = entry.rfind(':');
    h.name = colon == std::string::npos ? entry : entry.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string slots = entry.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      long value = std::strtol(slots.c_str(), &end, 10);
      if (slots.empty() || *end != '\0' || errno != 0 || value < 1 || value > 100000) {
        throw std::runtime_error("line " + std::to_string(number) + " '" + entry +
                                 "': the slots after ':' must be a whole number >= 1");
      }
      h.slots = static_cast<int>(value);
    }
    if (h.name.empty() || h.name.find_first_of(" \t") != std::string::npos) {
      throw std::runtime_error("line " + std::to_string(number) + " '" + entry +
                               "': expected host:slots (e.g. node1:4)");
    }
    if (!seen.insert(h.name).second) {
      throw std::runtime_error("line " + std::to_string(number) + ": host '" + h.name +
                               "' is listed twice");
    }
    hosts.push_back(h);
  }
  return hosts;
}

std::vector<HostSlots> run_discovery_script(const std::string& path,
                                            std::chrono::milliseconds timeout) {
  SpawnRequest request;
  request.path = path;
  request.argv = {path};
  request.env = current_environ();
  CapturedRun run;
  try {
    run = run_captured(request, timeout);
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("cannot run it: ") + e.what());
  }
  if (run.timed_out) {
    throw std::runtime_error("it ran longer than " + std::to_string(timeout.count()) +
                             " ms and was killed");
  }
  const int status = run.status;
  const std::string& err = run.err;
  const std::string& out = run.out;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string last;
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) last = line;
    }
    throw std::runtime_error(describe_status(status) +
                             (last.empty() ? "" : "; its last stderr line: " + quote_line(last)));
  }
  return parse_discovery_output(out);
}

double HostCooldown::record_failure(const std::string& host, Clock::time_point now) {
  Entry& e = hosts_[host];
  ++e.failures;
  const double seconds =
      std::min(kMaxCooldownSeconds, base_seconds_ * std::pow(2.0, std::min(e.failures - 1, 30)));
  e.until =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return seconds;
}

bool HostCooldown::available(const std::string& host, Clock::time_point now) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() || now >= it->second.until;
}

int HostCooldown::failures(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? 0 : it->second.failures;
}

bool HostCooldown::next_release(Clock::time_point now, Clock::time_point* when) const {
  bool any = false;
  for (const auto& [host, e] : hosts_) {
    if (e.until <= now) continue;
    if (!any || e.until < *when) *when = e.until;
    any = true;
  }
  return any;
}

}  // namespace kolo::launcher
