// The shared state behind a Handle (internal).
//
// One HandleState per request. The submitting thread keeps a Handle (a
// shared_ptr to it); the engine thread completes it exactly once with
// complete(). Callbacks registered before completion run on the engine thread
// inside complete(), before the request counts as finished: once wait()
// returns or poll() says true, every such callback has returned (so a
// callback must not wait on its own handle). Callbacks registered after
// completion run at once on the registering thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/engine.h"

namespace kolo::detail {

// Lets a caller that blocks on a request cut the engine thread's sleep short:
// with nothing left to overlap, the next negotiation should start now rather
// than at the end of the cycle. Shared by the engine and its handles (a handle
// may outlive the engine; poking a stopped engine does nothing).
class EngineWaker {
 public:
  void poke();
  // Sleeps up to `timeout`; returns early (and consumes the poke) if poked.
  void sleep_for(std::chrono::nanoseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable poked_cv_;
  bool poked_ = false;
};

struct HandleState {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  bool completing = false;  // complete() is running the callbacks
  std::exception_ptr error;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  // Results, written by the engine thread before complete().
  std::vector<int64_t> received_splits;  // allgather rows per rank / alltoall rows from each rank
  TensorView output;                     // allocated output (allgather, alltoall)
  int64_t value = 0;                     // scalar result (join: the last rank to join)
  std::shared_ptr<EngineWaker> waker;    // poked by wait() before it blocks

  // Runs the pending callbacks, then marks the request finished (error =
  // null on success) and, if `wake`, wakes the waiters. Returns the messages
  // of callbacks that threw (they are swallowed so the engine thread
  // survives; the engine logs them). With wake = false the caller must call
  // wake() afterwards: the engine finishes a whole fused batch first and then
  // wakes, so a caller waiting on the batch's handles one by one is woken
  // once, not once per handle.
  std::vector<std::string> complete(std::exception_ptr error, bool wake = true);
  void wake() { finished.notify_all(); }
  bool is_done();
};

}  // namespace kolo::detail
