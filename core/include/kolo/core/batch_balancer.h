// BatchBalancer: splits each step's global batch across the ranks in
// proportion to how fast each rank computes, so that a synchronous step is
// not held to its slowest worker's pace.
//
// Why. In synchronous data parallelism every step waits for every rank's
// gradients. With equal per-rank batches the world runs at (ranks x the
// slowest rank's rate), although the ranks together could compute the sum of
// their rates. Workers differ in speed on shared and heterogeneous machines
// (on this project's 2-core VM one core runs the seed CNN 5-25% slower than
// the other, changing from run to run). The balancer measures each rank's
// samples per second of compute and gives the faster ranks a larger share of
// the same global batch, so that all ranks finish their share at about the
// same time.
//
// The update stays that of one process with the whole global batch, provided
// each rank's gradient is weighted by its share: with per-rank losses that
// are means over their own b_r samples, the global mean's gradient is
// sum_r (b_r / G) g_r, and the DistributedOptimizer's average divides by the
// ranks, so each rank scales its loss by gradient_weight() = size * b_r / G
// before backward() (a scalar multiply: free, unlike scaling every gradient
// after it, and the same for any optimizer wrapper; the engine requires equal
// prescale factors on all ranks, so the weight cannot ride on the allreduce).
// Models whose result depends on the per-rank batch itself (batch
// normalisation without synchronisation) see different local batch
// statistics.
//
// Usage (every rank, every step):
//
//   kolo::BatchBalancerOptions balance;
//   balance.global_batch = 64 * kolo::size();
//   kolo::BatchBalancer balancer(balance);
//   for (int64_t step = 0; ...; ++step) {
//     // this rank's samples: [step * G + balancer.offset(), ... + balancer.batch())
//     auto t0 = clock::now();
//     loss = mean loss over this rank's balancer.batch() samples;
//     (loss * balancer.gradient_weight()).backward();
//     balancer.record(seconds since t0);   // collective every `interval` calls
//     optimizer.step();
//   }
//
// Measure only this rank's own compute (forward and backward), not the wait
// for the others inside step(): a rank that waited would otherwise look slow.
//
// Rebalancing. Every `interval`-th record() is collective: one allreduce of
// `size` doubles through the engine, each rank's median rate (samples per
// second of compute) over the steps since the last rebalance (a median, so
// that a step slowed once, e.g. by the first run of a new batch shape, does
// not move the split). Each rank's rate is smoothed across rebalances
// (exponential moving average with weight `smoothing` on the newest). The
// candidate split is proportional to the smoothed rates, in multiples of
// `granularity` samples, with no rank below floor(min_fraction x G / size)
// (and at least one unit), rounded by largest remainder so that it sums to
// exactly G. It replaces the current split only if it shortens the predicted
// step (the slowest rank's batch / rate) by more than `min_gain`: every new
// batch size costs the libraries a one-time setup (oneDNN builds new
// convolution kernels: 50-150 ms for the seed CNN here), so the split must
// not chase noise. Every rank computes the same split from the same reduced
// numbers, so all agree without further messages. Until the first change the
// split is even (in units of `granularity`, the first ranks taking the
// remainder).
//
// Placement. The balancer follows speeds that stay with a rank. Unpinned
// workers can be moved between cores of different speeds by the scheduler;
// the split then follows after an interval or two (the median and the
// smoothing keep single slow steps out). Pinning workers to cores (taskset,
// mpirun --bind-to core) makes each rank's speed steadier.
//
// Errors. Invalid options (G not a multiple of granularity, fewer than size
// units of granularity, interval < 1, smoothing or min_fraction outside
// (0, 1], min_gain outside [0, 1)) or options that differ between ranks are a
// ContractError on every rank from the constructor (which is collective).
// A negative or non-finite compute time is a ContractError from record().
// Not thread-safe: one training thread per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/engine.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// CallOptions: the engine (nullptr = kolo::runtime().engine()), the process
// set whose ranks share the batch (0 = every rank), and how long each of its
// collectives may wait (0 = no limit of its own).
struct BatchBalancerOptions : CallOptions {
  int64_t global_batch = 0;    // G: samples per step summed over all ranks
  int64_t granularity = 1;     // batches are multiples of it; G % granularity == 0
  int interval = 10;           // record() calls (steps) between rebalances
  double smoothing = 0.5;      // weight of the newest rate in the running average, (0, 1]
  double min_fraction = 0.25;  // floor of a rank's batch as a fraction of G / size, (0, 1]
  double min_gain = 0.03;      // predicted step-time gain a new split needs, [0, 1)
  std::string name = "kolo.batch_balancer";  // request name prefix (distinct per balancer)
};

class BatchBalancer {
 public:
  // Collective over the engine's world: checks the options on every rank.
  explicit BatchBalancer(const BatchBalancerOptions& options);

  // This rank's samples this step, and where they start within the step's
  // global batch (the ranks' ranges are disjoint and cover [0, G) in rank
  // order).
  int64_t batch() const { return batches_[rank_]; }
  int64_t offset() const { return offsets_[rank_]; }
  // Every rank's batch, by rank.
  const std::vector<int64_t>& batches() const { return batches_; }
  int64_t global_batch() const { return options_.global_batch; }
  // size * batch() / G: scale this rank's mean loss by it before backward()
  // so that the ranks' averaged gradients are the mean over the global batch.
  double gradient_weight() const;

  // Records this step's compute time of this rank, in seconds, for its
  // current batch(). Every `interval`-th call is collective and may change
  // the split; returns true when it did. A time of 0 carries no information
  // (that step is left out).
  bool record(double compute_seconds);

  // Smoothed samples per second of compute, by rank (0 before the first
  // rebalance), and the number of rebalances (collective rounds, whether or
  // not they changed the split) so far.
  const std::vector<double>& rates() const { return rates_; }
  int64_t rebalances() const { return rebalances_; }

  // The split itself (exposed for tests): batches proportional to `rates`
  // summing to `global_batch`, in multiples of `granularity`, none below
  // floor(min_fraction * units / n) units nor one unit. A rank with a
  // non-positive rate counts as the slowest positive one (all even when none
  // is positive).
  static std::vector<int64_t> split(int64_t global_batch, const std::vector<double>& rates,
                                    double min_fraction, int64_t granularity = 1);
  // The step time a split predicts: max over ranks of batch / rate (0 when a
  // rate is not positive).
  static double predicted_seconds(const std::vector<int64_t>& batches,
                                  const std::vector<double>& rates);

 private:
  void set_batches(std::vector<int64_t> batches);
  bool rebalance();  // true when the split moved

  BatchBalancerOptions options_;
  Engine* engine_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int64_t> batches_;
  std::vector<int64_t> offsets_;
  std::vector<double> rates_;
  int calls_since_ = 0;             // record() calls since the last rebalance
  std::vector<double> step_rates_;  // this rank's samples/second per step since the last rebalance
  int64_t rebalances_ = 0;
};

}  // namespace kolo
#pragma GCC visibility pop
