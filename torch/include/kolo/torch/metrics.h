// Averaging a metric (loss, accuracy ...) over the ranks.
#pragma once

#include <cstdint>
#include <string>

#include "kolo/torch/tensor.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// The mean of `value` over the ranks of options.process_set (every rank calls
// it with the same name; the request is "metric_average/<name>"). Computed in
// double precision. At world size 1 it returns `value`.
double metric_average(double value, const std::string& name, const CallOptions& options = {});

// The mean over every rank's samples, for exact evaluation over a sharded set
// whose shards differ in size (each rank's sum of per-sample losses or hits
// over its own samples, and their count): (sum of the ranks' `sum`) / (sum
// of their `count`), one allreduce of both ("metric_mean/<name>"), in double
// precision. metric_average of each rank's mean would weigh a rank with
// fewer samples as much as one with more. ContractError on every rank when
// a count is negative or the total is 0.
double metric_mean(double sum, int64_t count, const std::string& name,
                   const CallOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
