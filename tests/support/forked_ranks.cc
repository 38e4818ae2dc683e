// Ranks as forked processes (forked_ranks.h).
#include "forked_ranks.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"

namespace kolo::testing {

std::vector<RankOutcome> run_forked_ranks(
    int size, const std::function<std::string(int, SharedState&)>& body,
    const std::function<void(const std::vector<pid_t>&, SharedState&)>& monitor,
    std::chrono::milliseconds watchdog) {
  using Clock = std::chrono::steady_clock;
  if (size < 1 || size > kMaxForkedRanks) {
    throw std::invalid_argument("run_forked_ranks: size must be in [1, " +
                                std::to_string(kMaxForkedRanks) + "]");
  }
  void* memory =
      mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::runtime_error("mmap failed");
  auto* state = new (memory) SharedState();
  for (auto& p : state->progress) p = 0;

  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::string verdict;
      try {
        verdict = body(rank, *state);
      } catch (const std::exception& error) {
        verdict = std::string("unexpected exception: ") + error.what();
      }
      std::strncpy(state->result[rank], verdict.c_str(), kForkedMessageBytes - 1);
      _exit(verdict.empty() ? 0 : 1);  // no atexit handlers, no gtest teardown
    }
    pids.push_back(pid);
  }

  std::vector<RankOutcome> outcomes(size);
  std::vector<bool> done(size, false);
  const auto deadline = Clock::now() + watchdog;
  int remaining = size;
  while (remaining > 0) {
    for (int rank = 0; rank < size; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        done[rank] = true;
        --remaining;
        if (WIFEXITED(status)) outcomes[rank].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcomes[rank].signal = WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (Clock::now() > deadline) {
      for (int rank = 0; rank < size; ++rank) {
        if (!done[rank]) {
          kill(pids[rank], SIGKILL);
          waitpid(pids[rank], nullptr, 0);
          outcomes[rank].signal = SIGKILL;
          outcomes[rank].result = "hung: killed by the watchdog";
          done[rank] = true;
        }
      }
      break;
    }
    if (monitor) monitor(pids, *state);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < size; ++rank) {
    if (outcomes[rank].result.empty()) outcomes[rank].result = state->result[rank];
  }
  munmap(memory, sizeof(SharedState));
  return outcomes;
}

std::function<void(const std::vector<pid_t>& pids, SharedState& state)> kill_once_running(
    int victim, int size, bool* killed, int min_progress) {
  *killed = false;
  return [=](const std::vector<pid_t>& pids, SharedState& state) {
    if (*killed) return;
    for (int r = 0; r < size; ++r) {
      if (state.progress[r] < min_progress) return;
    }
    kill(pids[victim], SIGKILL);
    *killed = true;
  };
}

std::string allreduce_until_fault(Communicator& comm, int victim, size_t count,
                                  std::atomic<int>& progress, const std::string& expected_text) {
  std::vector<float> data(count, 1.0f);
  const std::string name = "rank " + std::to_string(victim);
  try {
    for (int i = 0; i < 1000000; ++i) {
      comm.allreduce(data.data(), data.data(), data.size(), DType::kF32, {ReduceOp::kAverage});
      progress++;
    }
  } catch (const RuntimeFault& fault) {
    const std::string text = fault.what();
    std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), text.c_str());
    const auto& failed = fault.failed_ranks();
    if (std::find(failed.begin(), failed.end(), victim) == failed.end()) {
      return "RuntimeFault does not name " + name + " in failed_ranks(): " + text;
    }
    if (text.find(std::to_string(victim)) == std::string::npos) {
      return "message does not name " + name + ": " + text;
    }
    if (text.find(expected_text) == std::string::npos) {
      return "message does not contain '" + expected_text + "': " + text;
    }
    if (dynamic_cast<const TimeoutError*>(&fault) != nullptr) {
      return "a dead peer was reported as a timeout: " + text;
    }
    try {
      comm.barrier({});
      return "barrier after the fault succeeded";
    } catch (const RuntimeFault&) {
    }
    return "";
  }
  return "allreduce loop ended without a fault";
}

}  // namespace kolo::testing
