// The worker side of `kolo-bench pipeline` (pipeline_bench.h): one rank of
// one layout, every configuration of the run in turn.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kolo/core/errors.h"
#include "kolo/core/parallel_grid.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/metrics.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/pipeline.h"
#include "kolo/torch/tensor_parallel.h"
#include "kolo/torch/zero.h"
#include "pipeline_bench.h"

namespace kolo::bench {
namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// --blocks MLP blocks as modules of one Sequential (a pipeline cuts between
// modules): Linear(hidden, ffn), GELU, Linear(ffn, hidden); with a
// tensor-parallel group the two Linears are split over it (Megatron's MLP:
// one allreduce forward, one backward).
torch::nn::Sequential build_model(const PipelineModelOptions& m, const ParallelGrid* tp_grid) {
  torch::manual_seed(42);  // the same weights on every rank
  torch::nn::Sequential model;
  for (int b = 0; b < m.blocks; ++b) {
    if (tp_grid == nullptr) {
      model->push_back(torch::nn::Linear(m.hidden, m.ffn));
      model->push_back(torch::nn::GELU());
      model->push_back(torch::nn::Linear(m.ffn, m.hidden));
      continue;
    }
    TensorParallelOptions tp;
    tp.process_set = tp_grid->tp_set();
    tp.name = "block" + std::to_string(b) + ".fc1";
    model->push_back(ColumnParallelLinear(m.hidden, m.ffn, tp));
    model->push_back(torch::nn::GELU());
    tp.name = "block" + std::to_string(b) + ".fc2";
    model->push_back(RowParallelLinear(m.ffn, m.hidden, tp));
  }
  return model;
}

// One configuration: a Pipeline of `model` with `schedule` and `micro_batches`
// (one stage per rank with "pp", a one-stage pipeline of this rank otherwise),
// trained for warmup + timed steps. Returns this rank's row.
nlohmann::json run_config(const PipelineWorkerOptions& o, torch::nn::Sequential model,
                          const std::string& schedule, int micro_batches) {
  const PipelineModelOptions& m = o.model;
  const bool pp = o.layout == "pp";
  const bool dp = o.layout == "dp";
  PipelineOptions options;
  options.schedule = parse_pipeline_schedule(schedule);
  options.micro_batches = micro_batches;
  if (!pp) options.stage_ranks = {kolo::rank()};
  options.optimizer_averages_micro_batches = dp;  // DistributedOptimizer divides by m
  Pipeline pipe(model, options);

  torch::optim::Adam adam(pipe.parameters(), torch::optim::AdamOptions(1e-4));
  std::unique_ptr<ParallelOptimizer> averaged;
  if (dp) {
    ParallelOptimizerOptions d;
    d.backward_passes_per_step = micro_batches;
    averaged = make_parallel_optimizer(adam, *pipe.module(), d);
  }
  // The data: the same global batch on every rank; a dp rank takes its rows.
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({m.batch, m.hidden});
  torch::Tensor y = torch::randn({m.batch, m.hidden});
  if (dp) {
    const int64_t rows = m.batch / kolo::size();
    x = x.narrow(0, kolo::rank() * rows, rows);
    y = y.narrow(0, kolo::rank() * rows, rows);
  }
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::nn::functional::mse_loss(out, target);
  };

  int64_t params = 0;
  for (const auto& p : pipe.parameters()) params += bytes_of(p);
  double step_seconds = 0, busy_seconds = 0;
  int64_t peak_activations = 0, peak_total = 0, grads = 0, state = 0;
  int steps_trained = 0;
  bool fits = true;
  for (int i = 0; i < m.warmup_steps + m.steps && fits; ++i) {
    if (averaged) {
      averaged->zero_grad();
    } else {
      adam.zero_grad();
    }
    pipe.train_step(x, y, mse);
    if (averaged) {
      averaged->step();
    } else {
      adam.step();
    }
    ++steps_trained;
    const Pipeline::Stats& stats = pipe.stats();
    // The accounting: what this rank holds at its peak, counted as if the
    // step's activations, the gradients and Adam's state were all alive at once.
    grads = 0;
    for (const auto& p : pipe.parameters()) grads += bytes_of(p.grad());
    state = optimizer_state_bytes(adam);
    peak_activations = std::max(peak_activations, stats.peak_activation_bytes);
    peak_total = std::max(peak_total, params + grads + state + stats.peak_activation_bytes);
    if (o.memory_limit_bytes > 0) {
      // Every rank stops when one is over the limit (a lone stage leaving
      // the pipeline would leave its neighbours waiting).
      const double over = peak_total > o.memory_limit_bytes ? 1.0 : 0.0;
      fits = metric_average(over, "pipeline_bench/over_limit") == 0.0;
    }
    if (i >= m.warmup_steps) {
      step_seconds += stats.step_seconds;
      busy_seconds += stats.busy_seconds;
    }
  }
  const int timed = std::max(0, steps_trained - m.warmup_steps);
  nlohmann::json row = {
      {"layout", o.layout},
      {"world_size", kolo::size()},
      {"rank", kolo::rank()},
      {"schedule", schedule},
      {"stages", pipe.stages()},
      {"stage", pipe.stage()},
      {"micro_batches", micro_batches},
      {"batch", m.batch},
      {"timed_steps", timed},
      {"step_seconds", timed ? step_seconds / timed : 0.0},
      {"busy_seconds", timed ? busy_seconds / timed : 0.0},
      {"idle_fraction", step_seconds > 0 ? 1.0 - busy_seconds / step_seconds : 0.0},
      {"param_bytes", params},
      {"grad_bytes", grads},
      {"optimizer_state_bytes", state},
      {"peak_activation_bytes", peak_activations},
      {"peak_memory_bytes", peak_total},
      {"memory_limit_bytes", o.memory_limit_bytes},
      {"fits", fits},  // no rank of the run was over the limit
      {"steps_trained", steps_trained}};
  return row;
}

}  // namespace

int run_pipeline_worker(const PipelineWorkerOptions& o) {
  const std::string& layout = o.layout;
  if (layout != "pp" && layout != "dp" && layout != "single" && layout != "tp") {
    throw ContractError("kolo-bench pipeline --worker: unknown --layout '" + layout +
                        "' (pp, dp, single or tp)");
  }
  torch::set_num_threads(o.model.threads);
  kolo::init();
  if (layout == "single" && kolo::size() != 1) {
    throw ContractError("kolo-bench pipeline --worker --layout single runs on 1 rank, not " +
                        std::to_string(kolo::size()));
  }
  if (layout == "dp" && o.model.batch % kolo::size() != 0) {
    throw ContractError("kolo-bench pipeline: --batch " + std::to_string(o.model.batch) +
                        " must divide by the " + std::to_string(kolo::size()) +
                        " data-parallel ranks");
  }
  std::unique_ptr<ParallelGrid> grid;
  if (layout == "tp") grid = std::make_unique<ParallelGrid>(1, 1, kolo::size());
  const torch::nn::Sequential model = build_model(o.model, grid.get());
  for (const std::string& schedule : o.schedules) {
    for (int m : o.micro_batches) {
      const nlohmann::json row = run_config(o, model, schedule, m);
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
    }
  }
  // Every rank finishes its last configuration before the engines shut down.
  kolo::runtime().world().barrier({});
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
