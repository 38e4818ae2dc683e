// The worker side of `kolo-bench zero` (zero_bench.h): one rank of one
// configuration.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "kolo/core/runtime.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/zero.h"
#include "zero_bench.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A field of /proc/self/status in bytes: VmHWM (the peak resident set of
// this process) or VmRSS (the resident set now); -1 when absent.
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0)
      return std::stoll(line.substr(field.size() + 1)) * 1024;  // kB
  }
  return -1;
}

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

int run_zero_worker(const ZeroWorkerOptions& options) {
  torch::set_num_threads(1);
  const bool ddp = options.mode == "ddp";
  int stage = 0;
  if (!ddp) {
    if (options.mode != "1" && options.mode != "2" && options.mode != "3") {
      throw std::invalid_argument("kolo-bench zero --worker: unknown --mode '" + options.mode +
                                  "' (ddp, 1, 2 or 3)");
    }
    stage = std::stoi(options.mode);
  }
  kolo::init();
  const int64_t start_rss = status_bytes("VmRSS");  // before the model: the runtime's own
  // Every rank builds the same parameters from the same seed (no broadcast
  // of 400 MB needed).
  torch::manual_seed(42);
  torch::nn::Sequential model;
  for (int i = 0; i < options.layers; ++i) {
    model->push_back(ShardedUnit(torch::nn::Linear(options.width, options.width)));
    if (i + 1 < options.layers) model->push_back(torch::nn::ReLU());
  }
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));
  std::unique_ptr<DistributedOptimizer> distributed;
  std::unique_ptr<ZeroOptimizer> zero;
  if (ddp) {
    distributed = std::make_unique<DistributedOptimizer>(adam, model->named_parameters());
  } else {
    ZeroOptions zo;
    zo.stage = stage;
    zo.prefetch = !options.no_prefetch;
    zero = std::make_unique<ZeroOptimizer>(adam, *model, zo);
  }
  torch::manual_seed(1000 + kolo::rank());
  const torch::Tensor x = torch::randn({options.batch, options.width});
  const torch::Tensor y = torch::randn({options.batch, options.width});
  auto step = [&] {
    if (ddp) {
      distributed->zero_grad();
    } else {
      zero->zero_grad();
    }
    torch::nn::functional::mse_loss(model->forward(x), y).backward();
    if (ddp) {
      distributed->step();
    } else {
      zero->step();
    }
  };
  for (int i = 0; i < options.warmup_steps; ++i) step();
  if (zero) zero->reset_peak();
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < options.steps; ++i) step();
  const double step_ms =
      1000.0 * std::chrono::duration<double>(Clock::now() - start).count() / options.steps;

  nlohmann::json row = {{"rank", kolo::rank()},
                        {"world_size", kolo::size()},
                        {"mode", options.mode},
                        {"prefetch", stage == 3 && !options.no_prefetch},
                        {"step_ms", step_ms}};
  if (zero) {
    const ZeroMemory m = zero->memory();
    row["param_bytes"] = m.param_bytes;
    row["grad_bytes"] = m.grad_bytes;
    row["optimizer_state_bytes"] = m.optimizer_state_bytes;
    row["peak_param_bytes"] = m.peak_param_bytes;
    row["peak_grad_bytes"] = m.peak_grad_bytes;
    row["peak_total_bytes"] = m.peak_total_bytes;
  } else {
    // DistributedOptimizer keeps everything whole: the model's parameters and
    // gradients (which stay defined between steps) and Adam's state.
    int64_t params = 0, grads = 0;
    for (const auto& p : model->parameters()) {
      params += bytes_of(p);
      grads += bytes_of(p.grad());
    }
    const int64_t state = optimizer_state_bytes(adam);
    row["param_bytes"] = params;
    row["grad_bytes"] = grads;
    row["optimizer_state_bytes"] = state;
    row["peak_param_bytes"] = params;
    row["peak_grad_bytes"] = grads;
    row["peak_total_bytes"] = params + grads + state;
  }
  // The largest unit (one Linear's weight and bias): stage 3's bound on the
  // parameters gathered at once is 1/N of the model plus this.
  int64_t largest_unit = 0;
  for (const auto& child : model->children()) {
    int64_t unit = 0;
    for (const auto& p : child->parameters()) unit += bytes_of(p);
    largest_unit = std::max(largest_unit, unit);
  }
  row["largest_unit_bytes"] = largest_unit;
  row["peak_rss_bytes"] = status_bytes("VmHWM");
  row["start_rss_bytes"] = start_rss;
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
  distributed.reset();
  zero.reset();
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
