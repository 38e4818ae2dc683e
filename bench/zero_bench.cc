// `kolo-bench zero` driver (zero_bench.h).
#include "zero_bench.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_report.h"
#include "kolo/core/errors.h"
#include "worker_runs.h"

namespace kolo::bench {
namespace {

// The configuration key of stage 3 run with ZeroOptions::prefetch = false.
constexpr const char* kStage3NoPrefetch = "3/no-prefetch";

std::string mib(int64_t bytes) { return format_fixed(static_cast<double>(bytes) / (1 << 20), 1); }

using Configs = std::map<std::pair<std::string, int>, nlohmann::json>;

double field(const nlohmann::json& row, const char* key) { return row.at(key).get<double>(); }

// The targets, evaluated on the measured rows: one table row per
// target and world size (memory at every N >= 2, step time at N = 2).
Report targets_report(const Configs& by_config, const std::vector<int>& workers) {
  Report t;
  t.title = "ZeRO targets (each stage against ddp at the same worker count)";
  t.columns = {"target", "workers", "measured", "result"};
  auto find = [&](const std::string& mode, int n) -> const nlohmann::json* {
    auto it = by_config.find({mode, n});
    return it == by_config.end() ? nullptr : &it->second;
  };
  auto add = [&](const std::string& target, int n, const std::string& measured, bool met) {
    t.add_row({target, std::to_string(n), measured, met ? "met" : "NOT met"},
              {{"target", target}, {"world_size", n}, {"measured", measured}, {"met", met}});
  };
  // measured / (ddp's / N): 1.000 is exactly 1/N.
  auto per_n = [&](const nlohmann::json& row, const nlohmann::json& ddp, const char* key, int n) {
    return field(row, key) / (field(ddp, key) / n);
  };
  for (int n : workers) {
    const nlohmann::json* ddp = find("ddp", n);
    if (ddp == nullptr || n < 2) continue;
    if (const nlohmann::json* s1 = find("1", n)) {
      const double r = per_n(*s1, *ddp, "optimizer_state_bytes", n);
      add("stage 1: Adam state = ddp's / N within 2%", n, format_fixed(r, 4) + " x 1/N",
          std::abs(r - 1) <= 0.02);
    }
    if (const nlohmann::json* s2 = find("2", n)) {
      const double state = per_n(*s2, *ddp, "optimizer_state_bytes", n);
      const double grads = per_n(*s2, *ddp, "grad_bytes", n);
      add("stage 2: Adam state and gradients = ddp's / N within 2%", n,
          "state " + format_fixed(state, 4) + ", grads " + format_fixed(grads, 4) + " x 1/N",
          std::abs(state - 1) <= 0.02 && std::abs(grads - 1) <= 0.02);
    }
    // The peak over the step (a unit gathered for forward or backward), not
    // just what is held after it. The bound holds without prefetch; with it
    // (the default) the next unit is gathered while one runs: reported.
    if (const nlohmann::json* s3 = find(kStage3NoPrefetch, n)) {
      const double bound = field(*ddp, "param_bytes") / n + field(*s3, "largest_unit_bytes");
      const double peak = field(*s3, "peak_param_bytes");
      add("stage 3 (no prefetch): peak parameters <= ddp's / N + largest unit", n,
          mib(static_cast<int64_t>(peak)) + " MiB (bound " + mib(static_cast<int64_t>(bound)) +
              " MiB)",
          peak <= bound);
    }
    if (const nlohmann::json* s3 = find("3", n)) {
      const double one_unit = field(*ddp, "param_bytes") / n + field(*s3, "largest_unit_bytes");
      const std::string measured = mib(static_cast<int64_t>(field(*s3, "peak_param_bytes"))) +
                                   " MiB (1/N + one unit: " + mib(static_cast<int64_t>(one_unit)) +
                                   " MiB)";
      const std::string target = "stage 3 with prefetch: peak parameters (1/N + two units)";
      t.add_row({target, std::to_string(n), measured, "reported"},
                {{"target", target}, {"world_size", n}, {"measured", measured}, {"met", true}});
    }
    // Peak RSS falls with each stage: ddp > 1 > 2 > 3 (where measured).
    std::string measured;
    bool falls = true;
    double previous = 0;
    for (const char* mode : {"ddp", "1", "2", "3"}) {  // kolo's own (FSDP2 is the peer)
      const nlohmann::json* row = find(mode, n);
      if (row == nullptr) continue;
      const double rss = field(*row, "peak_rss_bytes");
      if (!measured.empty()) {
        measured += " > ";
        falls = falls && rss < previous;
      }
      measured += mib(static_cast<int64_t>(rss));
      previous = rss;
    }
    add("peak RSS per rank falls: ddp > stage 1 > stage 2 > stage 3 (MiB)", n, measured, falls);
    // Stage 3 against FSDP2 at the same worker count: step time, and the
    // memory each holds (after the step; peak RSS above the start).
    const nlohmann::json* s3 = find("3", n);
    const nlohmann::json* fsdp2 = find("fsdp2", n);
    if (s3 != nullptr && fsdp2 != nullptr) {
      const double time = field(*s3, "step_ms") / field(*fsdp2, "step_ms");
      add("stage 3: step time <= FSDP2's", n, format_fixed(time, 2) + "x FSDP2's", time <= 1.0);
      auto held = [&](const nlohmann::json& r) {
        return field(r, "param_bytes") + field(r, "grad_bytes") + field(r, "optimizer_state_bytes");
      };
      add("stage 3: parameters + gradients + Adam state held <= FSDP2's (MiB)", n,
          mib(static_cast<int64_t>(held(*s3))) + " vs " + mib(static_cast<int64_t>(held(*fsdp2))),
          held(*s3) <= held(*fsdp2) * 1.001);
      auto grown = [&](const nlohmann::json& r) {
        return field(r, "peak_rss_bytes") - field(r, "start_rss_bytes");
      };
      add("stage 3: peak RSS above start <= FSDP2's (MiB)", n,
          mib(static_cast<int64_t>(grown(*s3))) + " vs " + mib(static_cast<int64_t>(grown(*fsdp2))),
          grown(*s3) <= grown(*fsdp2));
    }
    if (n != 2) continue;
    for (const char* mode : {"1", "2", "3"}) {
      const nlohmann::json* row = find(mode, n);
      if (row == nullptr) continue;
      const double ratio = field(*row, "step_ms") / field(*ddp, "step_ms");
      if (std::string(mode) == "3") {
        t.add_row({"stage 3: step time reported", std::to_string(n),
                   format_fixed(ratio, 2) + "x ddp", "reported"},
                  {{"target", "stage 3: step time reported"},
                   {"world_size", n},
                   {"measured", format_fixed(ratio, 2) + "x ddp"},
                   {"met", true}});
      } else {
        add(std::string("stage ") + mode + ": step time <= 1.3x ddp", n,
            format_fixed(ratio, 2) + "x", ratio <= 1.3);
      }
    }
  }
  return t;
}

}  // namespace

int run_zero_bench(const ZeroBenchOptions& options) {
  const std::string self = self_path("zero");
  const std::string kolorun = kolorun_path(options.kolorun, "zero");
  Report report;
  const int64_t params = static_cast<int64_t>(options.layers) * options.width * (options.width + 1);
  report.title = "ZeRO: per-rank memory and step time, " + std::to_string(options.layers) +
                 " x Linear(" + std::to_string(options.width) + ", " +
                 std::to_string(options.width) + ") = " + format_fixed(params / 1e6, 1) +
                 " M parameters, Adam, batch " + std::to_string(options.batch) +
                 " per worker, 1 thread per worker";
  report.columns = {"mode",           "workers",        "params MiB",
                    "grads MiB",      "Adam state MiB", "peak params MiB",
                    "peak total MiB", "peak RSS MiB",   "RSS above start MiB",
                    "step ms"};
  Configs by_config;
  bool failed = false;
  // Configurations: each mode, and stage 3 once more without prefetch
  // (keyed "3/no-prefetch"; its JSON rows say mode 3, prefetch false).
  std::vector<std::string> configs;
  for (const std::string& mode : options.modes) {
    configs.push_back(mode);
    if (mode == "3") configs.push_back(kStage3NoPrefetch);
  }
  // FSDP2 runs where --python has torch >= 2.6 (fully_shard in
  // torch.distributed.fsdp) and a torchrun that starts workers.
  const std::string python = options.python.empty() ? kBenchPython : options.python;
  const bool want_fsdp2 =
      std::find(options.modes.begin(), options.modes.end(), "fsdp2") != options.modes.end();
  const bool fsdp2_runs = want_fsdp2 && torchrun_works(python) &&
                          python_runs(python, "from torch.distributed.fsdp import fully_shard");
  if (want_fsdp2 && !fsdp2_runs) {
    report.notes.push_back("fsdp2: not measured (" + python +
                           " has no torch.distributed.fsdp.fully_shard with a torchrun that "
                           "starts workers: torch >= 2.6 is needed; pass --python)");
  }
  for (int workers : options.workers) {
    for (const std::string& config : configs) {
      const bool no_prefetch = config == kStage3NoPrefetch;
      const std::string mode = no_prefetch ? "3" : config;
      const std::string model_args = " --layers " + std::to_string(options.layers) + " --width " +
                                     std::to_string(options.width) + " --batch " +
                                     std::to_string(options.batch) + " --steps " +
                                     std::to_string(options.steps) + " --warmup-steps " +
                                     std::to_string(options.warmup_steps);
      std::ostringstream command;
      if (mode == "fsdp2") {
        if (!fsdp2_runs) continue;  // said in the notes
        command << "timeout " << options.config_timeout_s;
        for (const std::string& word : torchrun_argv(python, workers))
          command << " '" << word << "'";
        command << " '" << kBenchSourceDir << "/zero_worker_fsdp2.py'" << model_args;
      } else {
        command << "'" << kolorun << "' -np " << workers << " --job-timeout "
                << options.config_timeout_s << " '" << self << "' zero --worker --mode " << mode
                << model_args << (no_prefetch ? " --no-prefetch" : "");
      }
      std::cerr << "kolo-bench zero: mode " << config << ", " << workers << " worker(s)\n";
      const auto [out, status] = run_command(command.str(), "zero");
      const std::vector<nlohmann::json> rows = json_rows(out, "peak_rss_bytes");
      if (status != 0 || static_cast<int>(rows.size()) != workers) {
        std::cerr << "kolo-bench zero: mode " << mode << " at " << workers
                  << " workers failed (exit status " << status << ", " << rows.size() << " rows):\n"
                  << out;
        failed = true;
        continue;
      }
      // The largest value over the ranks (slices differ by one element).
      nlohmann::json row = {{"mode", mode}, {"world_size", workers}};
      if (mode == "3") row["prefetch"] = !no_prefetch;
      for (const char* key : {"param_bytes", "grad_bytes", "optimizer_state_bytes",
                              "peak_param_bytes", "peak_grad_bytes", "peak_total_bytes",
                              "peak_rss_bytes", "largest_unit_bytes", "start_rss_bytes"}) {
        int64_t most = 0;
        for (const auto& r : rows) most = std::max(most, r.at(key).get<int64_t>());
        row[key] = most;
      }
      double step_ms = 0;
      for (const auto& r : rows) step_ms = std::max(step_ms, r.at("step_ms").get<double>());
      row["step_ms"] = step_ms;
      by_config[{config, workers}] = row;
      report.add_row(
          {mode == "ddp" || mode == "fsdp2"
               ? (mode == "ddp" ? "ddp" : "FSDP2 (PyTorch)")
               : "stage " + mode + (no_prefetch ? ", no prefetch" : ""),
           std::to_string(workers), mib(row["param_bytes"]), mib(row["grad_bytes"]),
           mib(row["optimizer_state_bytes"]), mib(row["peak_param_bytes"]),
           mib(row["peak_total_bytes"]), mib(row["peak_rss_bytes"]),
           mib(row["peak_rss_bytes"].get<int64_t>() - row["start_rss_bytes"].get<int64_t>()),
           format_fixed(step_ms, 0)},
          row);
    }
  }

  // Against the targets: each stage at N workers vs ddp at N workers.
  for (const auto& [key, row] : by_config) {
    const auto& [mode, workers] = key;
    auto ddp = by_config.find({"ddp", workers});
    if (mode == "ddp" || mode == "fsdp2" || ddp == by_config.end()) continue;
    auto ratio = [&](const char* field) {
      return row.at(field).get<double>() / ddp->second.at(field).get<double>();
    };
    std::ostringstream note;
    note << "stage " << (mode == kStage3NoPrefetch ? "3 (no prefetch)" : mode) << " x" << workers
         << " / ddp x" << workers << ": Adam state "
         << format_fixed(ratio("optimizer_state_bytes") * workers, 3) << "/N, grads "
         << format_fixed(ratio("grad_bytes") * workers, 3) << "/N, params "
         << format_fixed(ratio("param_bytes") * workers, 3) << "/N (held after the step), peak RSS "
         << format_fixed(ratio("peak_rss_bytes"), 2) << "x, step time "
         << format_fixed(ratio("step_ms"), 2) << "x";
    report.notes.push_back(note.str());
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (int w : options.workers) {
    if (static_cast<unsigned>(w) > cores) {
      report.notes.push_back("rows with " + std::to_string(w) + " workers oversubscribe the " +
                             std::to_string(cores) + " cores (step times are not comparable)");
    }
  }

  const Report targets = targets_report(by_config, options.workers);
  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n" << targets.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    std::string body = "Command: `" + options.command_line +
                       "` (a plain process: every configuration runs in fresh workers started "
                       "through kolorun, FSDP2's through torchrun)\n\n**" +
                       report.title + "**\n\n" + report.markdown() + "\n**" + targets.title +
                       "**\n\n" + targets.markdown() + "\n";
    write_docs_section(options.docs_path, "zero", body);
    std::cout << "wrote the zero section of " << options.docs_path << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace kolo::bench
