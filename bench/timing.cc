#include "timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace kolo::bench {
namespace {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Largest value across ranks (every rank gets it).
double max_across(Communicator& sync, double value) {
  AllreduceOptions max_op;
  max_op.op = ReduceOp::kMax;
  sync.allreduce(&value, &value, 1, DType::kF64, max_op);
  return value;
}

}  // namespace

double time_collective_us(Communicator& sync, const std::function<void()>& op,
                          const TimingOptions& options) {
  for (int i = 0; i < options.warmup; ++i) op();
  // One timed call decides how many calls fill a repetition (same on every rank).
  sync.barrier({});
  double start = now_us();
  op();
  const double single_us = max_across(sync, now_us() - start);
  const int iters = std::clamp(static_cast<int>(options.rep_ms * 1000.0 / std::max(single_us, 0.1)),
                               1, options.max_iters);
  std::vector<double> per_call_us;
  for (int rep = 0; rep < options.repeats; ++rep) {
    sync.barrier({});
    start = now_us();
    for (int i = 0; i < iters; ++i) op();
    per_call_us.push_back(max_across(sync, (now_us() - start) / iters));
  }
  std::nth_element(per_call_us.begin(), per_call_us.begin() + per_call_us.size() / 2,
                   per_call_us.end());
  return per_call_us[per_call_us.size() / 2];
}

}  // namespace kolo::bench
