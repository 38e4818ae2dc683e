// Ranks as threads: run one function per rank on its own thread.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <vector>

namespace kolo::testing {

// Runs fn(rank) for rank = 0..n-1 on n threads and joins them all. Returns each
// rank's exception (null when fn returned normally).
//
// Watchdog: if the ranks have not all returned after `watchdog`, the test
// cannot continue safely (the threads still use the caller's data), so this
// prints the ranks still running to stderr and aborts the test process. Pick
// per-call timeouts well below it so that the code under test reports first.
std::vector<std::exception_ptr> run_ranks_catching(
    int n, const std::function<void(int rank)>& fn,
    std::chrono::milliseconds watchdog = std::chrono::seconds(240));

// As above, then rethrows the exception that was raised first (in time), if any.
void run_ranks(int n, const std::function<void(int rank)>& fn,
               std::chrono::milliseconds watchdog = std::chrono::seconds(240));

}  // namespace kolo::testing
