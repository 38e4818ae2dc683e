// Metric averaging (kolo/torch/metrics.h).
#include "kolo/torch/metrics.h"

#include <memory>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo {

namespace {

// Reduces `values` (doubles) over options.process_set with `op` as the
// request "<what>/<name>"; the result replaces them.
std::vector<double> reduce_doubles(std::vector<double> values, ReduceOp op, const std::string& what,
                                   const std::string& name, const CallOptions& options) {
  if (name.empty()) {
    throw ContractError("kolo::" + what +
                        ": the name is empty; name the metric the same on every rank "
                        "(e.g. \"val_loss\")");
  }
  Engine& engine = engine_of(options, "kolo::" + what);
  // On the heap and held by the request: a wait that times out must not leave
  // the engine writing into this frame.
  auto result = std::make_shared<std::vector<double>>(std::move(values));
  TensorView view{result->data(), DType::kF64, {static_cast<int64_t>(result->size())}};
  if (result->size() == 1) view.shape = {};
  RequestOptions request;
  request.op = op;
  request.process_set = options.process_set;
  Handle handle = engine.allreduce_async(what + "/" + name, view, view, request);
  handle.on_complete([result](std::exception_ptr) {});
  handle.wait(options.timeout);
  return *result;
}

}  // namespace

double metric_average(double value, const std::string& name, const CallOptions& options) {
  return reduce_doubles({value}, ReduceOp::kAverage, "metric_average", name, options)[0];
}

double metric_mean(double sum, int64_t count, const std::string& name, const CallOptions& options) {
  // A negative count is reduced as a marker (-1 samples can hide in a sum of
  // others), so every rank sees it and throws alike.
  const std::vector<double> totals =
      reduce_doubles({sum, static_cast<double>(count), count < 0 ? 1.0 : 0.0}, ReduceOp::kSum,
                     "metric_mean", name, options);
  if (totals[2] > 0) {
    throw ContractError("kolo::metric_mean('" + name + "'): a count is negative on " +
                        std::to_string(static_cast<int64_t>(totals[2])) +
                        " rank(s); pass each rank's number of samples (>= 0)");
  }
  if (totals[1] <= 0) {
    throw ContractError("kolo::metric_mean('" + name +
                        "'): no rank has a sample (every count is 0): the mean is undefined");
  }
  return totals[0] / totals[1];
}

}  // namespace kolo
