// Ranks as forked processes (forked_ranks.h).
#include "forked_ranks.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>

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

}  // namespace kolo::testing
