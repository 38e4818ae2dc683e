// The worker (and server) side of `kolo-bench ps` (ps_bench.h): one rank of
// one configuration.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "fashion_mnist_data.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/parameter_server.h"
#include "ps_bench.h"
#include "scaling_models.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The model as a module and its forward, for either choice.
struct BenchModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

BenchModel make_model(const std::string& name) {
  torch::manual_seed(42);  // every rank builds the same initial weights
  if (name == "mlp") {
    ScalingMlp m;
    return {m.ptr(), [m](const torch::Tensor& x) mutable { return m->forward(x); }};
  }
  if (name == "cnn") {
    ScalingCnn m;
    return {m.ptr(), [m](const torch::Tensor& x) mutable { return m->forward(x); }};
  }
  throw ContractError("kolo-bench ps: unknown --model '" + name + "'; use mlp, cnn or sparse");
}

torch::Tensor as_input(const torch::Tensor& images) {
  return images.to(torch::kFloat).div_(255.0);  // (B, 1, 28, 28) in [0, 1]
}

double test_accuracy(BenchModel& model, const fashion_mnist::Split& test) {
  torch::NoGradGuard no_grad;
  model.module->eval();
  int64_t correct = 0;
  const int64_t n = test.images.size(0);
  for (int64_t start = 0; start < n; start += 500) {
    const int64_t end = std::min(n, start + 500);
    const torch::Tensor logits = model.forward(as_input(test.images.slice(0, start, end)));
    correct += logits.argmax(1).eq(test.labels.slice(0, start, end)).sum().item<int64_t>();
  }
  model.module->train();
  return static_cast<double>(correct) / static_cast<double>(n);
}

int64_t param_bytes(torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * p.element_size();
  return bytes;
}

}  // namespace

nlohmann::json run_timed_steps(int epochs, int64_t steps_per_epoch, int64_t batch,
                               const std::function<void(int epoch, int64_t step)>& step) {
  int64_t steps = 0;
  const Clock::time_point start = Clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      step(epoch, s);
      steps += 1;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return {{"role", "worker"},
          {"rank", kolo::rank()},
          {"samples", steps * batch},
          {"seconds", seconds},
          {"steps", steps}};
}

int run_ps_worker(const PsWorkerOptions& options) {
  if (options.model == "sparse") return run_ps_sparse_worker(options);
  torch::set_num_threads(1);
  kolo::init();
  BenchModel model = make_model(options.model);
  const bool ps = options.design == "ps";
  ps::PsOptions ps_options;
  ps_options.mode = ps::parse_mode(options.mode, "kolo-bench ps --mode");
  ps_options.max_staleness = options.max_staleness;
  auto make_sgd = [&](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(options.lr).momentum(0.9));
  };

  ps::Links links;
  int workers = kolo::size();
  int worker = kolo::rank();
  if (ps) {
    links = ps::connect(kolo::runtime());
    workers = links.roles.workers;
    if (links.roles.is_server()) {
      ps::Server server(model.module->named_parameters(), make_sgd, std::move(links), ps_options);
      server.run();
      const ps::Server::Stats stats = server.stats();
      nlohmann::json row = {{"role", "server"},
                            {"rank", kolo::rank()},
                            {"updates", stats.staleness.updates},
                            {"max_staleness_seen", stats.staleness.max_staleness},
                            {"lost", stats.lost.size()}};
      std::cout << row.dump() << std::endl;
      kolo::shutdown();
      return 0;
    }
  }

  // This worker's rows of the subset: rows w, w + W, ... (same count on every worker).
  const fashion_mnist::Split train_all = fashion_mnist::load_split(options.data_dir, "train");
  fashion_mnist::Split test = fashion_mnist::load_split(options.data_dir, "t10k");
  const int64_t subset = std::min<int64_t>(options.train_subset, train_all.images.size(0));
  const int64_t per_worker = subset / workers;
  const int64_t steps_per_epoch = per_worker / options.batch;
  if (steps_per_epoch < 1) {
    throw ContractError("kolo-bench ps: --train-subset " + std::to_string(subset) + " gives " +
                        std::to_string(per_worker) + " rows per worker, less than one batch of " +
                        std::to_string(options.batch));
  }
  const torch::Tensor rows = torch::arange(worker, worker + per_worker * workers, workers);
  const torch::Tensor images = train_all.images.index_select(0, rows);
  const torch::Tensor labels = train_all.labels.index_select(0, rows);
  const int64_t test_n = std::min<int64_t>(options.test_subset, test.images.size(0));
  test.images = test.images.slice(0, 0, test_n);
  test.labels = test.labels.slice(0, 0, test_n);

  std::unique_ptr<ps::Worker> ps_worker;
  std::unique_ptr<torch::optim::Optimizer> sgd;
  std::unique_ptr<DistributedOptimizer> allreduce;
  if (ps) {
    ps_worker = std::make_unique<ps::Worker>(model.module->named_parameters(), std::move(links),
                                             ps_options);
  } else {
    sgd = make_sgd(model.module->parameters());
    broadcast_parameters(model.module->named_parameters(), 0);
    allreduce = std::make_unique<DistributedOptimizer>(*sgd, model.module->named_parameters());
  }

  torch::Tensor order;  // this epoch's shuffle
  nlohmann::json row =
      run_timed_steps(options.epochs, steps_per_epoch, options.batch, [&](int epoch, int64_t s) {
        if (s == 0) {
          torch::manual_seed(1000 + epoch * 100 + worker);
          order = torch::randperm(per_worker, torch::kLong);
        }
        const torch::Tensor idx = order.slice(0, s * options.batch, (s + 1) * options.batch);
        const torch::Tensor x = as_input(images.index_select(0, idx));
        const torch::Tensor y = labels.index_select(0, idx);
        if (ps) {
          ps_worker->pull();
          model.module->zero_grad();
        } else {
          allreduce->zero_grad();
        }
        torch::nn::functional::cross_entropy(model.forward(x), y).backward();
        if (ps) {
          ps_worker->push();
        } else {
          allreduce->step();
        }
      });
  const int64_t steps = row["steps"].get<int64_t>();
  // Per training step: taken before the evaluation's pull below.
  const ps::Worker::Stats moved = ps ? ps_worker->stats() : ps::Worker::Stats{};
  if (ps) ps_worker->pull();  // the parameters after every update this worker waited for
  if (ps) {
    row["bytes_per_step"] = (moved.bytes_pulled + moved.bytes_pushed) / std::max<int64_t>(1, steps);
    row["max_staleness_seen"] = moved.max_staleness_seen;
  } else {
    // Ring allreduce of the gradients: 2 (n - 1) / n of them leave (and
    // arrive at) each worker per step.
    row["bytes_per_step"] = static_cast<int64_t>(2.0 * (workers - 1) / workers *
                                                 static_cast<double>(param_bytes(*model.module)));
    row["max_staleness_seen"] = 0;
  }
  if (worker == 0) row["test_metric"] = test_accuracy(model, test);
  if (ps) ps_worker->finish();
  std::cout << row.dump() << std::endl;
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
