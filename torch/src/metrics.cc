// Metric averaging (kolo/torch/metrics.h).
#include "kolo/torch/metrics.h"

#include <memory>

#include "kolo/core/errors.h"

namespace kolo {

double metric_average(double value, const std::string& name, const CallOptions& options) {
  if (name.empty()) {
    throw ContractError(
        "kolo::metric_average: the name is empty; name the metric the same on every rank "
        "(e.g. \"val_loss\")");
  }
  Engine& engine = engine_of(options, "kolo::metric_average");
  // On the heap and held by the request: a wait that times out must not leave
  // the engine writing into this frame.
  auto result = std::make_shared<double>(value);
  TensorView view{result.get(), DType::kF64, {}};
  RequestOptions request;
  request.op = ReduceOp::kAverage;
  request.process_set = options.process_set;
  Handle handle = engine.allreduce_async("metric_average/" + name, view, view, request);
  handle.on_complete([result](std::exception_ptr) {});
  handle.wait(options.timeout);
  return *result;
}

}  // namespace kolo
