// Ranks as forked processes, for tests that kill a peer: each rank runs a
// body in its own child process and reports a verdict; the parent watches
// (and may kill) them and is the watchdog, so no test can hang.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kolo {
class Communicator;
}

namespace kolo::testing {

constexpr int kMaxForkedRanks = 8;
constexpr size_t kForkedMessageBytes = 1024;

// Shared between the parent and the forked ranks (MAP_SHARED, so it survives fork).
struct SharedState {
  std::atomic<int> progress[kMaxForkedRanks];         // steps completed per rank
  char result[kMaxForkedRanks][kForkedMessageBytes];  // each rank's verdict, "" = passed
};

struct RankOutcome {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string result;  // what the rank wrote into SharedState::result
};

// Forks `size` (<= kMaxForkedRanks) ranks running `body(rank, state)`; the
// body returns "" on success or a description of what went wrong (an
// exception counts as wrong). `monitor` (may be null) runs in the parent every
// few ms while the ranks run (e.g. to kill one). Every rank still alive at
// `watchdog` is SIGKILLed and reported as "hung".
std::vector<RankOutcome> run_forked_ranks(
    int size, const std::function<std::string(int rank, SharedState& state)>& body,
    const std::function<void(const std::vector<pid_t>& pids, SharedState& state)>& monitor,
    std::chrono::milliseconds watchdog);

// The killed-peer scenario of the fault tests. A monitor that SIGKILLs rank
// `victim` once every one of `size` ranks has made `min_progress` steps;
// *killed says whether it did.
std::function<void(const std::vector<pid_t>& pids, SharedState& state)> kill_once_running(
    int victim, int size, bool* killed, int min_progress = 5);

// The survivors' side: allreduces `count` f32 (average) on `comm` in a loop,
// counting `progress`, until a fault. Returns "" when it is a RuntimeFault,
// not a TimeoutError, whose failed_ranks() and message name `victim`, whose
// message contains `expected_text`, and after which the next call on `comm`
// fails at once; otherwise what was wrong. Prints the fault to stderr.
std::string allreduce_until_fault(Communicator& comm, int victim, size_t count,
                                  std::atomic<int>& progress, const std::string& expected_text);

}  // namespace kolo::testing
