// Ranks as threads with a watchdog (thread_ranks.h).
#include "thread_ranks.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace kolo::testing {

namespace {

struct Outcome {
  std::vector<std::exception_ptr> errors;
  int first_error_rank = -1;
};

Outcome run_all(int n, const std::function<void(int rank)>& fn,
                std::chrono::milliseconds watchdog) {
  std::mutex mutex;
  std::condition_variable finished;
  std::vector<bool> done(n, false);
  int remaining = n;
  Outcome outcome;
  outcome.errors.resize(n);

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      std::exception_ptr error;
      try {
        fn(rank);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      outcome.errors[rank] = error;
      if (error && outcome.first_error_rank < 0) outcome.first_error_rank = rank;
      done[rank] = true;
      if (--remaining == 0) finished.notify_all();
    });
  }

  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!finished.wait_for(lock, watchdog, [&] { return remaining == 0; })) {
      std::string running;
      for (int rank = 0; rank < n; ++rank) {
        if (!done[rank]) running += (running.empty() ? "" : ", ") + std::to_string(rank);
      }
      std::fprintf(stderr,
                   "run_ranks watchdog: rank(s) %s still running after %lld ms; a collective "
                   "hangs. Aborting the test process.\n",
                   running.c_str(), static_cast<long long>(watchdog.count()));
      std::fflush(stderr);
      std::abort();  // test code only: the threads still reference the caller's data
    }
  }
  for (auto& thread : threads) thread.join();
  return outcome;
}

}  // namespace

std::vector<std::exception_ptr> run_ranks_catching(int n, const std::function<void(int rank)>& fn,
                                                   std::chrono::milliseconds watchdog) {
  return run_all(n, fn, watchdog).errors;
}

void run_ranks(int n, const std::function<void(int rank)>& fn, std::chrono::milliseconds watchdog) {
  Outcome outcome = run_all(n, fn, watchdog);
  if (outcome.first_error_rank >= 0)
    std::rethrow_exception(outcome.errors[outcome.first_error_rank]);
}

}  // namespace kolo::testing
