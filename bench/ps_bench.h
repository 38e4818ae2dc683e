// `kolo-bench ps`: the seeds' Design 1 (parameter server) against Design 2
// (ring allreduce) on the same work (issue 19). The seed CNN and the MLP of
// `kolo-bench scaling` train on a subset of Fashion-MNIST for --epochs at
// each worker count, with:
//   design allreduce   kolo::DistributedOptimizer (mode "sync")
//   design ps          kolo::ps::Server / Worker, modes sync, async and ssp
//                      (--max-staleness), at each --servers count
// Every configuration runs in fresh processes through kolorun (`kolorun -np
// W [--servers S] kolo-bench ps --worker ...`). Each worker trains on its
// shard of the subset with SGD (momentum 0.9) and prints one JSON line:
// samples it trained, its training seconds, the bytes it moved per step and,
// on worker 0, the test accuracy of the final parameters (for ps, after a
// last pull) and the largest staleness it saw. The driver prints one row per
// configuration: samples/sec of the whole job (samples of all workers over
// the slowest worker's time), bytes per step per worker, test accuracy and
// max staleness; --json prints the rows as the issue lists them, --docs
// rewrites the `ps` section of docs/strategies.md.
// Model `sparse` (ps_sparse_bench.cc) is an embedding table of --rows x 64
// and a small MLP on synthetic click data, trained with Adagrad: design ps
// moves only the rows a step touches, design allreduce the whole table; its
// test_metric is the held-out log-loss (lower is better).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kolo::bench {

struct PsBenchOptions {
  std::vector<std::string> models = {"mlp", "cnn"};
  std::vector<std::string> designs = {"allreduce", "ps"};
  std::vector<std::string> modes = {"sync", "async", "ssp"};  // ps only
  std::vector<int> workers = {2, 4};
  std::vector<int> servers = {1, 2};
  int max_staleness = 2;
  int epochs = 1;
  int train_subset = 6000;
  int test_subset = 2000;
  int batch = 32;  // per worker per step
  double lr = 0.02;
  int64_t rows = 10'000'000;  // model sparse: the table's rows
  int config_timeout_s = 900;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool json = false;
  std::string docs_path;
  std::string kolorun;
  std::string command_line;
};

struct PsWorkerOptions {
  std::string model = "mlp";
  std::string design = "ps";
  std::string mode = "sync";
  int max_staleness = 2;
  int epochs = 1;
  int train_subset = 6000;
  int test_subset = 2000;
  int batch = 32;
  double lr = 0.02;
  int64_t rows = 10'000'000;
  std::string data_dir;
};

// The timed training loop of a worker (ps_worker.cc, ps_sparse_bench.cc):
// runs step(epoch, s) for s in [0, steps_per_epoch) of each epoch, timing
// only the steps, and returns the worker's row as far as the loop knows it:
// role, rank, samples (steps * batch), seconds, steps.
nlohmann::json run_timed_steps(int epochs, int64_t steps_per_epoch, int64_t batch,
                               const std::function<void(int epoch, int64_t step)>& step);

int run_ps_bench(const PsBenchOptions& options);
int run_ps_worker(const PsWorkerOptions& options);
int run_ps_sparse_worker(const PsWorkerOptions& options);  // model sparse

}  // namespace kolo::bench
