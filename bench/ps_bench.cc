// `kolo-bench ps` driver (ps_bench.h).
#include "ps_bench.h"

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_report.h"
#include "worker_runs.h"

namespace kolo::bench {
namespace {

struct Config {
  std::string model;
  std::string design;
  std::string mode;
  int workers = 2;
  int servers = 0;
};

std::vector<Config> configs_of(const PsBenchOptions& o) {
  std::vector<Config> configs;
  for (const std::string& model : o.models) {
    for (int w : o.workers) {
      for (const std::string& design : o.designs) {
        if (design == "allreduce") {
          configs.push_back({model, design, "sync", w, 0});
          continue;
        }
        for (int s : o.servers) {
          for (const std::string& mode : o.modes) configs.push_back({model, design, mode, w, s});
        }
      }
    }
  }
  return configs;
}

}  // namespace

int run_ps_bench(const PsBenchOptions& options) {
  const std::string self = self_path("ps");
  const std::string kolorun = kolorun_path(options.kolorun, "ps");
  Report report;
  const bool sparse_only = std::all_of(options.models.begin(), options.models.end(),
                                       [](const std::string& m) { return m == "sparse"; });
  if (sparse_only) {
    report.title = "Parameter server against allreduce, sparse model: a table of " +
                   std::to_string(options.rows) + " rows x 64 and an MLP, " +
                   std::to_string(options.train_subset) + " synthetic clicks, " +
                   std::to_string(options.epochs) + " epoch(s), batch " +
                   std::to_string(options.batch) + " per worker, Adagrad lr " +
                   format_fixed(options.lr, 3) + ", 1 thread per process";
  } else {
    report.title = "Parameter server against allreduce: Fashion-MNIST subset of " +
                   std::to_string(options.train_subset) + " images, " +
                   std::to_string(options.epochs) + " epoch(s), batch " +
                   std::to_string(options.batch) + " per worker, SGD lr " +
                   format_fixed(options.lr, 3) + " momentum 0.9, 1 thread per process";
  }
  report.columns = {"model",
                    "design",
                    "mode",
                    "workers",
                    "servers",
                    "samples/s",
                    "MiB/step/worker",
                    sparse_only ? "test log-loss" : "test accuracy",
                    "max staleness"};
  bool failed = false;
  double sparse_floor = -1, sparse_initial = -1;  // model sparse: held-out loss bounds
  for (const Config& c : configs_of(options)) {
    std::ostringstream command;
    command << "'" << kolorun << "' -np " << c.workers;
    if (c.servers > 0) command << " --servers " << c.servers;
    command << " --job-timeout " << options.config_timeout_s << " '" << self
            << "' ps --worker --model " << c.model << " --design " << c.design << " --mode "
            << c.mode << " --max-staleness " << options.max_staleness << " --epochs "
            << options.epochs << " --train-subset " << options.train_subset << " --test-subset "
            << options.test_subset << " --batch " << options.batch << " --lr " << options.lr
            << " --rows " << options.rows << " --data-dir '" << options.data_dir << "'";
    std::cerr << "kolo-bench ps: " << c.model << " " << c.design << " " << c.mode << ", "
              << c.workers << " worker(s), " << c.servers << " server(s)\n";
    const auto [out, status] = run_command(command.str(), "ps");
    const std::vector<nlohmann::json> rows = json_rows(out, "role");
    std::vector<nlohmann::json> workers, servers;
    for (const auto& r : rows) (r.at("role") == "server" ? servers : workers).push_back(r);
    if (status != 0 || static_cast<int>(workers.size()) != c.workers ||
        static_cast<int>(servers.size()) != c.servers) {
      std::cerr << "kolo-bench ps: " << c.model << " " << c.design << " " << c.mode
                << " failed (exit status " << status << ", " << workers.size() << " worker and "
                << servers.size() << " server rows):\n"
                << out;
      failed = true;
      continue;
    }
    // The job's throughput: every worker's samples over the slowest worker's time.
    int64_t samples = 0, bytes = 0, staleness = 0;
    double seconds = 0, metric = -1, floor_loss = -1, initial_loss = -1;
    for (const auto& r : workers) {
      samples += r.at("samples").get<int64_t>();
      seconds = std::max(seconds, r.at("seconds").get<double>());
      bytes = std::max(bytes, r.at("bytes_per_step").get<int64_t>());
      staleness = std::max(staleness, r.at("max_staleness_seen").get<int64_t>());
      if (r.contains("test_metric")) metric = r.at("test_metric").get<double>();
      if (r.contains("hidden_model_loss")) {
        floor_loss = r.at("hidden_model_loss").get<double>();
        initial_loss = r.at("initial_test_loss").get<double>();
      }
    }
    for (const auto& r : servers) {
      staleness = std::max(staleness, r.at("max_staleness_seen").get<int64_t>());
    }
    const double per_sec = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
    nlohmann::json row = {
        {"model", c.model},        {"design", c.design},    {"mode", c.mode},
        {"workers", c.workers},    {"servers", c.servers},  {"samples_per_sec", per_sec},
        {"bytes_per_step", bytes}, {"test_metric", metric}, {"max_staleness_seen", staleness}};
    if (c.mode == "ssp") row["max_staleness"] = options.max_staleness;
    if (floor_loss >= 0) {
      row["hidden_model_loss"] = floor_loss;
      row["initial_test_loss"] = initial_loss;
      sparse_floor = floor_loss;
      sparse_initial = initial_loss;
    }
    report.add_row(
        {c.model, c.design,
         c.mode == "ssp" ? "ssp (" + std::to_string(options.max_staleness) + ")" : c.mode,
         std::to_string(c.workers), std::to_string(c.servers), format_fixed(per_sec, 0),
         format_fixed(static_cast<double>(bytes) / (1 << 20), 2), format_fixed(metric, 3),
         std::to_string(staleness)},
        row);
  }
  report.notes.push_back(
      "MiB/step/worker: ps = parameters pulled + gradients pushed by one worker per step "
      "(counted); allreduce = 2 (n-1)/n of the gradients (the ring's model)");
  report.notes.push_back(
      "staleness: how many steps the worker that computed an update was ahead of the slowest "
      "live worker when it pulled (sync: 0 by construction; ssp: <= max_staleness)");
  if (sparse_floor >= 0) {
    report.notes.push_back(
        "sparse: test metric = held-out log-loss (lower is better); the initial parameters "
        "score " +
        format_fixed(sparse_initial, 4) + ", the hidden model that drew the labels " +
        format_fixed(sparse_floor, 4) + "; mlp and cnn: test accuracy");
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  report.notes.push_back("processes per job = workers + servers on " + std::to_string(cores) +
                         " cores: rows with more processes than cores are oversubscribed");

  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    const std::string body = "Command: `" + options.command_line +
                             "` (every configuration in fresh processes through kolorun)\n\n**" +
                             report.title + "**\n\n" + report.markdown() + "\n";
    // Model sparse has a section of its own (docs/strategies.md, "Sparse embeddings").
    const std::string section = sparse_only ? "ps-sparse" : "ps";
    write_docs_section(options.docs_path, section, body);
    std::cout << "wrote the " << section << " section of " << options.docs_path << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace kolo::bench
