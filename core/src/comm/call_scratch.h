// Per-call helpers shared by the gloo and mpi backends (internal): a call's
// deadline and grow-only scratch memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace kolo::detail {

// The deadline of one collective call.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds timeout)
      : timeout_(timeout), end_(Clock::now() + timeout) {}
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Time left, rounded up to whole milliseconds; zero once passed.
  std::chrono::milliseconds remaining() const {
    const auto left = end_ - Clock::now();
    if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
    return std::chrono::ceil<std::chrono::milliseconds>(left);
  }
  bool passed() const { return passed(Clock::now()); }
  bool passed(Clock::time_point now) const { return now >= end_; }

 private:
  std::chrono::milliseconds timeout_;
  Clock::time_point end_;
};

// Grow-only scratch memory (8-byte aligned), reused across calls.
class Scratch {
 public:
  uint8_t* get(size_t bytes) {
    if (bytes > storage_.size() * sizeof(double)) {
      storage_.clear();
      storage_.shrink_to_fit();
      storage_.resize((bytes + sizeof(double) - 1) / sizeof(double));
    }
    return reinterpret_cast<uint8_t*>(storage_.data());
  }

 private:
  std::vector<double> storage_;
};

}  // namespace kolo::detail
