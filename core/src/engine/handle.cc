// Handle, HandleState and TensorView (engine.h, handle.h).
#include "engine/handle.h"

#include <chrono>

#include "kolo/core/errors.h"

namespace kolo {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorView::bytes() const {
  const int64_t n = numel();
  return n <= 0 ? 0 : static_cast<size_t>(n) * dtype_size(dtype);
}

namespace detail {

std::vector<std::string> HandleState::complete(std::exception_ptr failure, bool wake) {
  std::vector<std::string> callback_errors;
  std::unique_lock<std::mutex> lock(mutex);
  if (done || completing) return callback_errors;
  completing = true;
  error = failure;
  // Callbacks run before the request counts as finished, so that whatever
  // they do (copy results out, release buffers) is visible after wait().
  // Callbacks registered meanwhile join the list and run in this loop.
  while (!callbacks.empty()) {
    std::vector<std::function<void(std::exception_ptr)>> to_run;
    to_run.swap(callbacks);
    lock.unlock();
    for (auto& callback : to_run) {
      try {
        callback(failure);
      } catch (const std::exception& e) {
        callback_errors.push_back(e.what());
      } catch (...) {
        callback_errors.push_back("unknown exception");
      }
    }
    lock.lock();
  }
  done = true;
  lock.unlock();
  if (wake) finished.notify_all();
  return callback_errors;
}

void EngineWaker::poke() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    poked_ = true;
  }
  poked_cv_.notify_one();
}

void EngineWaker::sleep_for(std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  poked_cv_.wait_for(lock, timeout, [&] { return poked_; });
  poked_ = false;
}

bool HandleState::is_done() {
  std::lock_guard<std::mutex> lock(mutex);
  return done;
}

}  // namespace detail

namespace {

detail::HandleState& state_of(const std::shared_ptr<detail::HandleState>& state,
                              const char* method) {
  if (!state) {
    throw ContractError(std::string("kolo::Handle::") + method +
                        ": the handle is empty (default-constructed); use the Handle returned "
                        "by an Engine *_async call");
  }
  return *state;
}

}  // namespace

bool Handle::poll() const { return state_of(state_, "poll").is_done(); }

void Handle::wait(std::chrono::milliseconds timeout) const {
  detail::HandleState& s = state_of(state_, "wait");
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.done) {  // the common case after a fused batch: no clock, no condition variable
    if (s.error) std::rethrow_exception(s.error);
    return;
  }
  if (s.waker) {
    // About to block: the engine need not finish its cycle's sleep first.
    std::shared_ptr<detail::EngineWaker> waker = s.waker;
    lock.unlock();
    waker->poke();
    lock.lock();
  }
  if (timeout.count() <= 0 || timeout == std::chrono::milliseconds::max()) {
    s.finished.wait(lock, [&] { return s.done; });
  } else {
    // Clamp so that now + timeout cannot overflow the clock.
    const auto bounded = std::min(timeout, std::chrono::milliseconds(int64_t{1} << 40));
    if (!s.finished.wait_for(lock, bounded, [&] { return s.done; })) {
      throw TimeoutError("kolo::Handle::wait: the request did not finish within " +
                         std::to_string(timeout.count()) +
                         " ms (it keeps running; wait again or check for a stall)");
    }
  }
  if (s.error) std::rethrow_exception(s.error);
}

void Handle::on_complete(std::function<void(std::exception_ptr)> callback) const {
  detail::HandleState& s = state_of(state_, "on_complete");
  if (!callback) return;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.done) {
      s.callbacks.push_back(std::move(callback));
      return;
    }
    error = s.error;
  }
  callback(error);
}

std::vector<int64_t> Handle::received_splits() const {
  detail::HandleState& s = state_of(state_, "received_splits");
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.received_splits;
}

TensorView Handle::output() const {
  detail::HandleState& s = state_of(state_, "output");
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.output;
}

}  // namespace kolo
