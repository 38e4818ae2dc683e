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
// 2 x size doubles (each rank's samples and compute seconds since the last
// rebalance) through the engine. Each rank's rate is smoothed across
// rebalances (exponential moving average with weight `smoothing` on the
// newest), and the new batches are proportional to the smoothed rates, with
// no rank below floor(min_fraction x G / size) samples (and at least 1),
// rounded by largest remainder so that they sum to exactly G. Every rank
// computes the same split from the same reduced numbers, so all agree
// without further messages. Until the first rebalance the split is even
// (the first G % size ranks take one more).
//
// Errors. Invalid options (G < size, interval < 1, smoothing outside (0, 1],
// min_fraction outside (0, 1]) or options that differ between ranks are a
// ContractError on every rank from the constructor (which is collective).
// A negative or non-finite compute time is a ContractError from record().
// Not thread-safe: one training thread per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo {

class Engine;

struct BatchBalancerOptions {
  int64_t global_batch = 0;   // G: samples per step summed over all ranks (>= size)
  int interval = 5;           // record() calls (steps) between rebalances
  double smoothing = 0.5;     // weight of the newest rate in the running average, (0, 1]
  double min_fraction = 0.25;  // floor of a rank's batch as a fraction of G / size, (0, 1]
  Engine* engine = nullptr;   // nullptr = kolo::runtime().engine(); the whole world
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
  // the split; returns true when it did.
  bool record(double compute_seconds);

  // Smoothed samples per second of compute, by rank (0 before the first
  // rebalance), and the number of rebalances so far.
  const std::vector<double>& rates() const { return rates_; }
  int64_t rebalances() const { return rebalances_; }

  // The split itself (exposed for tests): batches proportional to `rates`
  // summing to `global_batch`, none below floor(min_fraction * G / n) nor 1.
  // A rank with a non-positive rate counts as the slowest positive one (all
  // even when none is positive).
  static std::vector<int64_t> split(int64_t global_batch, const std::vector<double>& rates,
                                    double min_fraction);

 private:
  void set_batches(std::vector<int64_t> batches);
  void rebalance();

  BatchBalancerOptions options_;
  Engine* engine_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int64_t> batches_;
  std::vector<int64_t> offsets_;
  std::vector<double> rates_;
  int calls_since_ = 0;         // record() calls since the last rebalance
  double samples_since_ = 0;    // this rank's samples over those calls
  double seconds_since_ = 0;    // and their compute seconds
  int64_t rebalances_ = 0;
};

}  // namespace kolo
