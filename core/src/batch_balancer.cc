// BatchBalancer (kolo/core/batch_balancer.h): per-rank batches proportional
// to the ranks' measured compute rates.
#include "kolo/core/batch_balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {

namespace {

constexpr const char* kWhat = "kolo::BatchBalancer";

// "" when the options are valid for a world of `size` ranks.
std::string check_options(const BatchBalancerOptions& o, int size) {
  std::ostringstream error;
  if (o.global_batch < size) {
    error << "options.global_batch is " << o.global_batch << ", below the " << size
          << " ranks (every rank needs at least one sample per step); pass the samples per step "
             "summed over all ranks";
  } else if (o.interval < 1) {
    error << "options.interval is " << o.interval << "; it must be at least 1 step";
  } else if (!(o.smoothing > 0 && o.smoothing <= 1)) {
    error << "options.smoothing is " << o.smoothing << "; it must be in (0, 1]";
  } else if (!(o.min_fraction > 0 && o.min_fraction <= 1)) {
    error << "options.min_fraction is " << o.min_fraction << "; it must be in (0, 1]";
  }
  return error.str();
}

TensorView f64_view(std::vector<double>& values) {
  return TensorView{values.data(), DType::kF64, {static_cast<int64_t>(values.size())}};
}

}  // namespace

std::vector<int64_t> BatchBalancer::split(int64_t global_batch, const std::vector<double>& rates,
                                          double min_fraction) {
  const size_t n = rates.size();
  if (n == 0 || global_batch < static_cast<int64_t>(n)) {
    throw ContractError(std::string(kWhat) + "::split: " + std::to_string(global_batch) +
                        " samples cannot give each of " + std::to_string(n) +
                        " ranks at least one");
  }
  const int64_t floor_batch = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(min_fraction * static_cast<double>(global_batch) /
                                         static_cast<double>(n))));
  // Ranks without a rate yet count as the slowest measured one.
  double slowest = 0;
  for (double r : rates) {
    if (r > 0 && std::isfinite(r)) slowest = slowest == 0 ? r : std::min(slowest, r);
  }
  std::vector<double> weight(n, 1.0);
  if (slowest > 0) {
    for (size_t i = 0; i < n; ++i) weight[i] = rates[i] > 0 && std::isfinite(rates[i]) ? rates[i] : slowest;
  }
  // Water-filling: ranks whose proportional share falls below the floor get
  // the floor; the rest share what remains in proportion to their weights.
  // floor_batch * n <= global_batch, so at least one rank stays unclamped.
  std::vector<bool> clamped(n, false);
  std::vector<double> ideal(n, 0.0);
  for (;;) {
    int64_t free = global_batch;
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (clamped[i]) free -= floor_batch;
      else total += weight[i];
    }
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (clamped[i]) continue;
      ideal[i] = static_cast<double>(free) * weight[i] / total;
      if (ideal[i] < static_cast<double>(floor_batch)) {
        clamped[i] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Largest remainder: floors first, then one more sample to the ranks with
  // the largest fractional parts (lower rank first on ties) until the sum is
  // exactly global_batch.
  std::vector<int64_t> batches(n);
  int64_t sum = 0;
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i) {
    batches[i] = clamped[i] ? floor_batch
                            : std::max(floor_batch, static_cast<int64_t>(std::floor(ideal[i])));
    sum += batches[i];
    if (!clamped[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ideal[a] - std::floor(ideal[a]) > ideal[b] - std::floor(ideal[b]);
  });
  for (size_t k = 0; sum < global_batch; k = (k + 1) % order.size()) {
    ++batches[order[k]];
    ++sum;
  }
  // Rounding can only overshoot by a sample or so: take it from the largest.
  while (sum > global_batch) {
    const auto largest = std::max_element(batches.begin(), batches.end());
    --*largest;
    --sum;
  }
  return batches;
}

BatchBalancer::BatchBalancer(const BatchBalancerOptions& options)
    : options_(options), engine_(options.engine ? options.engine : &runtime().engine()) {
  rank_ = engine_->rank();
  size_ = engine_->size();
  // Local validity and agreement in one allreduce (max of the values and of
  // their negations gives every option's largest and smallest value across
  // ranks), so that every rank throws, not just the ones that are wrong.
  const std::string error = check_options(options, size_);
  const std::vector<double> mine = {static_cast<double>(options.global_batch),
                                    static_cast<double>(options.interval), options.smoothing,
                                    options.min_fraction};
  const char* names[] = {"global_batch", "interval", "smoothing", "min_fraction"};
  const size_t k = mine.size();
  std::vector<double> wire(2 * k + 1);
  for (size_t i = 0; i < k; ++i) {
    wire[i] = mine[i];
    wire[k + i] = -mine[i];
  }
  wire[2 * k] = error.empty() ? 0.0 : 1.0;
  RequestOptions max;
  max.op = ReduceOp::kMax;
  engine_->allreduce(options.name + ".check", f64_view(wire), f64_view(wire), max);
  if (!error.empty()) throw ContractError(std::string(kWhat) + ": " + error);
  if (wire[2 * k] > 0) {
    throw ContractError(std::string(kWhat) +
                        ": the options are invalid on another rank (see its error)");
  }
  for (size_t i = 0; i < k; ++i) {
    if (wire[i] != -wire[k + i]) {
      std::ostringstream message;
      message << kWhat << ": options." << names[i] << " differs between ranks (from "
              << -wire[k + i] << " to " << wire[i] << "; this rank has " << mine[i]
              << "); every rank must pass the same options";
      throw ContractError(message.str());
    }
  }
  rates_.assign(size_, 0.0);
  set_batches(split(options.global_batch, std::vector<double>(size_, 1.0), 1.0));
}

void BatchBalancer::set_batches(std::vector<int64_t> batches) {
  batches_ = std::move(batches);
  offsets_.assign(size_, 0);
  for (int r = 1; r < size_; ++r) offsets_[r] = offsets_[r - 1] + batches_[r - 1];
}

double BatchBalancer::gradient_weight() const {
  return static_cast<double>(size_) * static_cast<double>(batch()) /
         static_cast<double>(options_.global_batch);
}

bool BatchBalancer::record(double compute_seconds) {
  if (!(compute_seconds >= 0) || !std::isfinite(compute_seconds)) {
    throw ContractError(std::string(kWhat) + "::record: compute time " +
                        std::to_string(compute_seconds) +
                        " s; pass this step's forward and backward time in seconds (>= 0)");
  }
  samples_since_ += static_cast<double>(batch());
  seconds_since_ += compute_seconds;
  if (++calls_since_ < options_.interval) return false;
  const std::vector<int64_t> before = batches_;
  rebalance();
  return batches_ != before;
}

void BatchBalancer::rebalance() {
  const size_t n = static_cast<size_t>(size_);
  std::vector<double> wire(2 * n, 0.0);
  wire[rank_] = samples_since_;
  wire[n + rank_] = seconds_since_;
  RequestOptions sum;
  sum.op = ReduceOp::kSum;
  engine_->allreduce(options_.name + ".rates", f64_view(wire), f64_view(wire), sum);
  for (size_t r = 0; r < n; ++r) {
    if (!(wire[n + r] > 0)) continue;  // no time measured: keep the last rate
    const double rate = wire[r] / wire[n + r];
    rates_[r] = rates_[r] > 0 ? options_.smoothing * rate + (1 - options_.smoothing) * rates_[r]
                              : rate;
  }
  set_batches(split(options_.global_batch, rates_, options_.min_fraction));
  calls_since_ = 0;
  samples_since_ = 0;
  seconds_since_ = 0;
  ++rebalances_;
}

}  // namespace kolo
