// kolorun --check-build -H host,...: the build report of every named host.
//
// Each remote host runs this kolorun's own path with --check-build over the
// same ssh command workers use (the build must be at the same path on every
// host, as for workers). kolorun prints its own report, then one line per
// host: the same as this host's, different (followed by the host's report),
// or unreachable (with ssh's code and last stderr line).
#pragma once

#include <chrono>
#include <ostream>
#include <string>

#include "options.h"

namespace kolo::launcher {

struct RemoteCheckOptions {
  std::string kolorun_path;                  // absolute path of this kolorun (/proc/self/exe)
  std::string local_report;                  // check_build_text() of this host
  std::chrono::milliseconds timeout{30000};  // per host
};

// Prints the reports to `out`. Returns 0 when every host answered with this
// host's report, 1 otherwise.
int check_build_on_hosts(const LaunchOptions& options, const RemoteCheckOptions& check,
                         std::ostream& out);

}  // namespace kolo::launcher
