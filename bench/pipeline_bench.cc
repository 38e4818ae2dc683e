// `kolo-bench pipeline` driver (pipeline_bench.h).
#include "pipeline_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#include "bench_report.h"
#include "kolo/core/errors.h"
#include "worker_runs.h"

namespace kolo::bench {
namespace {

constexpr const char* kMode = "pipeline";

std::string mib(double bytes) { return format_fixed(bytes / (1 << 20), 1); }

template <typename T>
std::string joined(const std::vector<T>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

std::string describe(const PipelineModelOptions& m) {
  const double params = static_cast<double>(m.blocks) * 2.0 * m.hidden * m.ffn +
                        static_cast<double>(m.blocks) * (m.ffn + m.hidden);
  return std::to_string(m.blocks) + " MLP blocks (" + std::to_string(m.hidden) + " -> " +
         std::to_string(m.ffn) + " -> " + std::to_string(m.hidden) +
         ", GELU) = " + format_fixed(params / 1e6, 1) + " M parameters, Adam, global batch " +
         std::to_string(m.batch);
}

// Runs one layout on `ranks` workers; every rank's rows (empty on failure,
// after printing why).
class Runner {
 public:
  explicit Runner(const PipelineBenchOptions& options)
      : options_(options), self_(self_path(kMode)), kolorun_(kolorun_path(options.kolorun, kMode)) {
    if (access(kolorun_.c_str(), X_OK) != 0) {
      throw ContractError("kolo-bench pipeline: " + kolorun_ +
                          " is not an executable; build it (cmake --build <dir> --target kolorun) "
                          "or pass --kolorun");
    }
  }

  std::vector<nlohmann::json> run(int ranks, const std::string& layout,
                                  const PipelineModelOptions& m,
                                  const std::vector<std::string>& schedules,
                                  const std::vector<int>& micro_batches, int64_t limit_bytes) {
    std::ostringstream command;
    command << "'" << kolorun_ << "' -np " << ranks << " --job-timeout "
            << options_.config_timeout_s << " '" << self_ << "' pipeline --worker --layout "
            << layout << " --schedules " << joined(schedules) << " --micro-batches "
            << joined(micro_batches) << " --blocks " << m.blocks << " --hidden " << m.hidden
            << " --ffn " << m.ffn << " --batch " << m.batch << " --steps " << m.steps
            << " --warmup-steps " << m.warmup_steps << " --threads " << m.threads
            << " --memory-limit-bytes " << limit_bytes;
    std::cerr << "kolo-bench pipeline: " << layout << " on " << ranks << " rank(s)\n";
    const auto [out, status] = run_command(command.str(), kMode);
    std::vector<nlohmann::json> rows = json_rows(out, "idle_fraction");
    const size_t expected = static_cast<size_t>(ranks) * schedules.size() * micro_batches.size();
    if (status != 0 || rows.size() != expected) {
      std::cerr << "kolo-bench pipeline: " << layout << " on " << ranks
                << " rank(s) failed (exit status " << status << ", " << rows.size() << " of "
                << expected << " rows):\n"
                << out;
      failed = true;
      return {};
    }
    return rows;
  }

  bool failed = false;

 private:
  const PipelineBenchOptions& options_;
  std::string self_, kolorun_;
};

// The rows of one configuration (every rank's), by (schedule, m).
std::map<std::pair<std::string, int>, std::vector<nlohmann::json>> by_config(
    const std::vector<nlohmann::json>& rows) {
  std::map<std::pair<std::string, int>, std::vector<nlohmann::json>> out;
  for (const auto& r : rows) out[{r.at("schedule"), r.at("micro_batches")}].push_back(r);
  return out;
}

double most(const std::vector<nlohmann::json>& rows, const char* key) {
  double value = 0;
  for (const auto& r : rows) value = std::max(value, r.at(key).get<double>());
  return value;
}

// Samples/sec of a configuration: the global batch over the slowest rank's
// mean step time.
double samples_per_sec(const std::vector<nlohmann::json>& rows) {
  const double step = most(rows, "step_seconds");
  return step > 0 ? rows.front().at("batch").get<double>() / step : 0.0;
}

}  // namespace

int run_pipeline_bench(const PipelineBenchOptions& options) {
  Runner runner(options);
  const PipelineModelOptions& model = options.model;

  Report bubble;
  bubble.title = "Pipeline bubble: " + describe(model) + ", " + std::to_string(model.steps) +
                 " timed steps, 1 torch thread per rank";
  bubble.columns = {"schedule",          "stages",
                    "micro-batches",     "bubble (mean)",
                    "bubble per stage",  "theory",
                    "measured - theory", "samples/s",
                    "step ms",           "peak activations MiB (largest stage)"};
  std::map<std::pair<std::string, int>, double> best_pp2;  // (schedule, m) -> samples/s at p = 2
  std::map<std::tuple<int, std::string, int>, double> kolo_sps;  // (p, schedule, m) -> samples/s
  for (int p : options.stages) {
    const std::vector<nlohmann::json> rows =
        runner.run(p, "pp", model, options.schedules, options.micro_batches, 0);
    for (const auto& [key, ranks] : by_config(rows)) {
      const auto& [schedule, m] = key;
      std::vector<nlohmann::json> stages = ranks;
      std::sort(stages.begin(), stages.end(),
                [](const auto& a, const auto& b) { return a.at("stage") < b.at("stage"); });
      std::vector<double> idle;
      std::string per_stage;
      double mean = 0;
      for (const auto& r : stages) {
        idle.push_back(r.at("idle_fraction").get<double>());
        per_stage += (per_stage.empty() ? "" : " / ") + format_fixed(idle.back(), 3);
        mean += idle.back() / stages.size();
      }
      const double theory = static_cast<double>(p - 1) / (m + p - 1);
      const double sps = samples_per_sec(stages);
      const double activations = most(stages, "peak_activation_bytes");
      if (p == 2) best_pp2[key] = sps;
      kolo_sps[{p, schedule, m}] = sps;
      bubble.add_row({schedule, std::to_string(p), std::to_string(m), format_fixed(mean, 3),
                      per_stage, format_fixed(theory, 3),
                      (mean >= theory ? "+" : "") + format_fixed(100 * (mean - theory), 1) + " pts",
                      format_fixed(sps, 1), format_fixed(1000 * most(stages, "step_seconds"), 1),
                      mib(activations)},
                     {{"table", "bubble"},
                      {"schedule", schedule},
                      {"stages", p},
                      {"micro_batches", m},
                      {"bubble_fraction", mean},
                      {"bubble_per_stage", idle},
                      {"theory", theory},
                      {"samples_per_sec", sps},
                      {"step_ms", 1000 * most(stages, "step_seconds")},
                      {"peak_activation_bytes", static_cast<int64_t>(activations)}});
      // The target: within 5 points of theory at m >= 4p on 2 stages.
      if (p == 2 && m >= 4 * p) {
        const bool met = std::abs(mean - theory) <= 0.05;
        bubble.notes.push_back("target (2 stages, m >= 4p): " + schedule +
                               " m=" + std::to_string(m) + ": measured " + format_fixed(mean, 3) +
                               " vs theory " + format_fixed(theory, 3) + ": " +
                               (met ? "met" : "NOT met") + " (within 5 points)");
      }
    }
  }

  Report throughput;
  throughput.title = "Throughput on the same model: one rank, data parallel and pp = 2";
  throughput.columns = {"layout", "ranks", "schedule", "micro-batches", "samples/s", "vs dp=2"};
  if (options.compare_dp) {
    const auto single = runner.run(1, "single", model, {"1f1b"}, {1}, 0);
    const auto dp = runner.run(2, "dp", model, {"1f1b"}, {1}, 0);
    const double dp_sps = dp.empty() ? 0.0 : samples_per_sec(dp);
    auto add = [&](const std::string& layout, int ranks, const std::string& schedule, int m,
                   double sps) {
      const double vs = dp_sps > 0 ? sps / dp_sps : 0.0;
      throughput.add_row({layout, std::to_string(ranks), schedule, std::to_string(m),
                          format_fixed(sps, 1), format_fixed(vs, 2) + "x"},
                         {{"table", "throughput"},
                          {"layout", layout},
                          {"ranks", ranks},
                          {"schedule", schedule},
                          {"micro_batches", m},
                          {"samples_per_sec", sps},
                          {"vs_dp", vs}});
    };
    if (!single.empty()) add("1 rank (unsplit)", 1, "-", 1, samples_per_sec(single));
    if (!dp.empty()) add("dp=2", 2, "-", 1, dp_sps);
    for (const std::string& schedule : options.schedules) {
      std::pair<int, double> best{0, 0.0};
      for (const auto& [key, sps] : best_pp2) {
        if (key.first == schedule && sps > best.second) best = {key.second, sps};
      }
      if (best.first > 0) add("pp=2 (best m)", 2, schedule, best.first, best.second);
    }
  }

  Report peer;
  peer.title =
      "Against PyTorch's torch.distributed.pipelining (the same model, stages and "
      "micro-batches; gloo, under torchrun)";
  peer.columns = {"schedule",       "stages",          "micro-batches",
                  "kolo samples/s", "torch samples/s", "kolo / torch"};
  if (options.compare_torch) {
    const std::string python = options.python.empty() ? kBenchPython : options.python;
    const bool torch_runs =
        torchrun_works(python) && python_runs(python, "import torch.distributed.pipelining");
    if (!torch_runs) {
      peer.notes.push_back("not measured: " + python +
                           " has no torch.distributed.pipelining with a torchrun that starts "
                           "workers (torch >= 2.4 is needed; pass --python)");
    }
    for (int p : options.stages) {
      if (!torch_runs) break;
      std::ostringstream command;
      command << "timeout " << options.config_timeout_s;
      for (const std::string& word : torchrun_argv(python, p)) command << " '" << word << "'";
      command << " '" << kBenchSourceDir << "/pipeline_worker_torch.py' --schedules "
              << joined(options.schedules) << " --micro-batches " << joined(options.micro_batches)
              << " --blocks " << model.blocks << " --hidden " << model.hidden << " --ffn "
              << model.ffn << " --batch " << model.batch << " --steps " << model.steps
              << " --warmup-steps " << model.warmup_steps << " --threads " << model.threads;
      std::cerr << "kolo-bench pipeline: torch.distributed.pipelining on " << p << " rank(s)\n";
      const auto [out, status] = run_command(command.str(), kMode);
      const std::vector<nlohmann::json> rows = json_rows(out, "step_seconds");
      const size_t expected =
          static_cast<size_t>(p) * options.schedules.size() * options.micro_batches.size();
      if (status != 0 || rows.size() != expected) {
        std::cerr << "kolo-bench pipeline: torch.distributed.pipelining on " << p
                  << " rank(s) failed (exit status " << status << ", " << rows.size() << " of "
                  << expected << " rows):\n"
                  << out;
        peer.notes.push_back("torch.distributed.pipelining on " + std::to_string(p) +
                             " ranks failed (exit status " + std::to_string(status) +
                             "; its output is on stderr)");
        runner.failed = true;
        continue;
      }
      for (const auto& [key, ranks] : by_config(rows)) {
        const auto& [schedule, m] = key;
        auto mine = kolo_sps.find({p, schedule, m});
        const double kolo = mine == kolo_sps.end() ? 0.0 : mine->second;
        if (ranks.front().contains("unsupported")) {
          const std::string why = ranks.front().at("unsupported");
          peer.add_row({schedule, std::to_string(p), std::to_string(m), format_fixed(kolo, 1),
                        "not supported", "-"},
                       {{"table", "torch"},
                        {"schedule", schedule},
                        {"stages", p},
                        {"micro_batches", m},
                        {"kolo_samples_per_sec", kolo},
                        {"torch_unsupported", why}});
          peer.notes.push_back("torch " + schedule + " m=" + std::to_string(m) + ": " + why);
          continue;
        }
        const double torch_sps = samples_per_sec(ranks);
        const double ratio = torch_sps > 0 ? kolo / torch_sps : 0.0;
        peer.add_row({schedule, std::to_string(p), std::to_string(m), format_fixed(kolo, 1),
                      format_fixed(torch_sps, 1), format_fixed(ratio, 2) + "x"},
                     {{"table", "torch"},
                      {"schedule", schedule},
                      {"stages", p},
                      {"micro_batches", m},
                      {"kolo_samples_per_sec", kolo},
                      {"torch_samples_per_sec", torch_sps},
                      {"kolo_over_torch", ratio}});
        if (schedule == "1f1b" && kolo > 0) {
          peer.notes.push_back("target (1F1B >= 1.0x torch's, " + std::to_string(p) +
                               " stages, m=" + std::to_string(m) + "): " + format_fixed(ratio, 2) +
                               "x: " + (ratio >= 1.0 ? "met" : "NOT met"));
        }
      }
    }
  }

  Report memory;
  const PipelineModelOptions& big = options.memory_model;
  const int64_t limit = options.memory_limit_mib << 20;
  memory.title = "Memory per rank under a limit of " + std::to_string(options.memory_limit_mib) +
                 " MiB (the bench's accounting: parameters + gradients + Adam state + peak "
                 "activations): " +
                 describe(big) + ", 1F1B on " + std::to_string(options.memory_micro_batches) +
                 " micro-batches";
  memory.columns = {"layout",         "ranks",          "params MiB",
                    "grads MiB",      "Adam state MiB", "peak activations MiB",
                    "peak total MiB", "fits",           "steps trained"};
  bool memory_target = options.memory_limit_mib > 0;
  if (options.memory_limit_mib > 0) {
    for (const auto& [layout, ranks] :
         std::vector<std::pair<std::string, int>>{{"single", 1}, {"pp", 2}, {"tp", 2}}) {
      const auto rows =
          runner.run(ranks, layout, big, {"1f1b"}, {options.memory_micro_batches}, limit);
      if (rows.empty()) {
        memory_target = false;
        continue;
      }
      // The largest rank's figures (stages differ; tensor slices are alike).
      const nlohmann::json* top = &rows.front();
      for (const auto& r : rows) {
        if (r.at("peak_memory_bytes") > top->at("peak_memory_bytes")) top = &r;
      }
      const bool fits = top->at("fits").get<bool>();
      const std::string name = layout == "single" ? "unsplit" : layout + "=2";
      memory_target = memory_target && (layout == "single" ? !fits : fits);
      memory.add_row({name, std::to_string(ranks), mib(top->at("param_bytes")),
                      mib(top->at("grad_bytes")), mib(top->at("optimizer_state_bytes")),
                      mib(top->at("peak_activation_bytes")), mib(top->at("peak_memory_bytes")),
                      fits ? "yes" : "no", std::to_string(top->at("steps_trained").get<int>())},
                     {{"table", "memory"},
                      {"layout", name},
                      {"ranks", ranks},
                      {"param_bytes", top->at("param_bytes")},
                      {"grad_bytes", top->at("grad_bytes")},
                      {"optimizer_state_bytes", top->at("optimizer_state_bytes")},
                      {"peak_activation_bytes", top->at("peak_activation_bytes")},
                      {"peak_memory_bytes", top->at("peak_memory_bytes")},
                      {"memory_limit_bytes", limit},
                      {"fits", fits},
                      {"steps_trained", top->at("steps_trained")}});
    }
    memory.notes.push_back(std::string("target (too large unsplit, trains with pp=2 and tp=2 "
                                       "within the limit): ") +
                           (memory_target ? "met" : "NOT met"));
  }

  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (int p : options.stages) {
    if (static_cast<unsigned>(p) > cores) {
      bubble.notes.push_back("rows with " + std::to_string(p) + " stages oversubscribe the " +
                             std::to_string(cores) +
                             " cores: stages take turns on a core, so their idle time is not "
                             "the schedule's bubble");
    }
  }

  std::vector<const Report*> reports = {&bubble};
  if (options.compare_dp) reports.push_back(&throughput);
  if (options.compare_torch) reports.push_back(&peer);
  if (options.memory_limit_mib > 0) reports.push_back(&memory);
  if (options.json) {
    for (const Report* r : reports) {
      for (const auto& row : r->json_rows) std::cout << row.dump() << "\n";
    }
  } else {
    for (const Report* r : reports) std::cout << r->text() << "\n";
  }
  if (!options.docs_path.empty()) {
    std::string body = "Command: `" + options.command_line +
                       "` (a plain process: every configuration runs in fresh workers started "
                       "through kolorun, PyTorch's through torchrun, one rank per stage)\n";
    for (const Report* r : reports) body += "\n**" + r->title + "**\n\n" + r->markdown();
    for (const std::string& path : options.docs_path) {
      write_docs_section(path, "pipeline", body);
      std::cout << "wrote the pipeline section of " << path << "\n";
    }
  }
  return runner.failed ? 1 : 0;
}

}  // namespace kolo::bench
