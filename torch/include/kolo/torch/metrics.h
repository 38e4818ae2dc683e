// Averaging a metric (loss, accuracy ...) over the ranks.
#pragma once

#include <string>

#include "kolo/torch/tensor.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// The mean of `value` over the ranks of options.process_set (every rank calls
// it with the same name; the request is "metric_average/<name>"). Computed in
// double precision. At world size 1 it returns `value`.
double metric_average(double value, const std::string& name, const CallOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
