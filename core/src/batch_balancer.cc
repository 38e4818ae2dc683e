// BatchBalancer (kolo/core/batch_balancer.h): per-rank batches proportional
// to the ranks' measured compute rates.
#include "kolo/core/batch_balancer.h"

#include <algorithm>
#include <cmath>
#include <memory>
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
  if (o.granularity < 1) {
    error << "options.granularity is " << o.granularity << "; it must be at least 1 sample";
  } else if (o.global_batch % o.granularity != 0) {
    error << "options.global_batch " << o.global_batch << " is not a multiple of "
          << "options.granularity " << o.granularity
          << "; batches are handed out in whole units of granularity";
  } else if (o.global_batch / o.granularity < size) {
    error << "options.global_batch is " << o.global_batch << ": " << o.global_batch / o.granularity
          << " units of " << o.granularity << " for " << size
          << " ranks (every rank needs at least one unit per step); pass the samples per step "
             "summed over all ranks";
  } else if (o.interval < 1) {
    error << "options.interval is " << o.interval << "; it must be at least 1 step";
  } else if (!(o.smoothing > 0 && o.smoothing <= 1)) {
    error << "options.smoothing is " << o.smoothing << "; it must be in (0, 1]";
  } else if (!(o.min_fraction > 0 && o.min_fraction <= 1)) {
    error << "options.min_fraction is " << o.min_fraction << "; it must be in (0, 1]";
  } else if (!(o.min_gain >= 0 && o.min_gain < 1)) {
    error << "options.min_gain is " << o.min_gain << "; it must be in [0, 1)";
  }
  return error.str();
}

// Allreduces `values` in place on the options' process set, waiting at most
// options.timeout (0 = no limit of its own). The engine works on a heap copy
// that the request holds: a wait that times out must not leave it writing
// into the caller's vector.
void allreduce_doubles(Engine& engine, const std::string& name, std::vector<double>& values,
                       ReduceOp op, const BatchBalancerOptions& options) {
  auto wire = std::make_shared<std::vector<double>>(values);
  const TensorView view{wire->data(), DType::kF64, {static_cast<int64_t>(wire->size())}};
  RequestOptions request;
  request.op = op;
  request.process_set = options.process_set;
  Handle handle = engine.allreduce_async(name, view, view, request);
  handle.on_complete([wire](std::exception_ptr) {});
  handle.wait(options.timeout);
  values = *wire;
}

}  // namespace

std::vector<int64_t> BatchBalancer::split(int64_t global_batch, const std::vector<double>& rates,
                                          double min_fraction, int64_t granularity) {
  const size_t n = rates.size();
  if (granularity < 1 || global_batch % granularity != 0 || n == 0 ||
      global_batch / granularity < static_cast<int64_t>(n)) {
    throw ContractError(std::string(kWhat) + "::split: " + std::to_string(global_batch) +
                        " samples in units of " + std::to_string(granularity) +
                        " cannot give each of " + std::to_string(n) + " ranks at least one unit");
  }
  if (granularity > 1) {
    std::vector<int64_t> units = split(global_batch / granularity, rates, min_fraction, 1);
    for (int64_t& u : units) u *= granularity;
    return units;
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
    for (size_t i = 0; i < n; ++i)
      weight[i] = rates[i] > 0 && std::isfinite(rates[i]) ? rates[i] : slowest;
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
      if (clamped[i])
        free -= floor_batch;
      else
        total += weight[i];
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
    // Unclamped: ideal >= floor_batch, an integer, so its floor is too.
    batches[i] = clamped[i] ? floor_batch : static_cast<int64_t>(std::floor(ideal[i]));
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

double BatchBalancer::predicted_seconds(const std::vector<int64_t>& batches,
                                        const std::vector<double>& rates) {
  double slowest = 0;
  for (size_t r = 0; r < batches.size() && r < rates.size(); ++r) {
    if (!(rates[r] > 0)) return 0;
    slowest = std::max(slowest, static_cast<double>(batches[r]) / rates[r]);
  }
  return slowest;
}

BatchBalancer::BatchBalancer(const BatchBalancerOptions& options)
    : options_(options),
      engine_(options.engine ? options.engine : &runtime_for("kolo::BatchBalancer").engine()) {
  const ProcessSet set = engine_->process_set(options.process_set);
  if (!set.included()) {
    throw ContractError(std::string(kWhat) + ": rank " + std::to_string(engine_->rank()) +
                        " is not a member of process set " + std::to_string(options.process_set) +
                        "; only the set's members construct its BatchBalancer");
  }
  rank_ = set.rank();
  size_ = set.size();
  // Local validity and agreement in one allreduce (max of the values and of
  // their negations gives every option's largest and smallest value across
  // ranks), so that every rank throws, not just the ones that are wrong.
  const std::string error = check_options(options, size_);
  const std::vector<double> mine = {static_cast<double>(options.global_batch),
                                    static_cast<double>(options.granularity),
                                    static_cast<double>(options.interval),
                                    options.smoothing,
                                    options.min_fraction,
                                    options.min_gain};
  const char* names[] = {"global_batch", "granularity",  "interval",
                         "smoothing",    "min_fraction", "min_gain"};
  const size_t k = mine.size();
  std::vector<double> wire(2 * k + 1);
  for (size_t i = 0; i < k; ++i) {
    wire[i] = mine[i];
    wire[k + i] = -mine[i];
  }
  wire[2 * k] = error.empty() ? 0.0 : 1.0;
  allreduce_doubles(*engine_, options.name + ".check", wire, ReduceOp::kMax, options);
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
  set_batches(
      split(options.global_batch, std::vector<double>(size_, 1.0), 1.0, options.granularity));
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
  if (compute_seconds > 0) step_rates_.push_back(static_cast<double>(batch()) / compute_seconds);
  if (++calls_since_ < options_.interval) return false;
  return rebalance();
}

bool BatchBalancer::rebalance() {
  // This rank's median rate over the interval (0 = nothing measured).
  std::vector<double> wire(static_cast<size_t>(size_), 0.0);
  if (!step_rates_.empty()) {
    const auto middle = step_rates_.begin() + static_cast<std::ptrdiff_t>(step_rates_.size() / 2);
    std::nth_element(step_rates_.begin(), middle, step_rates_.end());
    wire[rank_] = *middle;
  }
  allreduce_doubles(*engine_, options_.name + ".rates", wire, ReduceOp::kSum, options_);
  for (size_t r = 0; r < wire.size(); ++r) {
    if (!(wire[r] > 0)) continue;  // nothing measured: keep the last rate
    rates_[r] = rates_[r] > 0 ? options_.smoothing * wire[r] + (1 - options_.smoothing) * rates_[r]
                              : wire[r];
  }
  std::vector<int64_t> candidate =
      split(options_.global_batch, rates_, options_.min_fraction, options_.granularity);
  const double now = predicted_seconds(batches_, rates_);
  const double then = predicted_seconds(candidate, rates_);
  const bool move = now > 0 && then > 0 && then < (1 - options_.min_gain) * now;
  if (move) set_batches(std::move(candidate));
  calls_since_ = 0;
  step_rates_.clear();
  ++rebalances_;
  return move;
}

}  // namespace kolo
