// `kolo-bench zero` driver (zero_bench.h).
#include "zero_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_report.h"
#include "kolo/core/errors.h"

namespace kolo::bench {
namespace {

namespace fs = std::filesystem;

std::string self_path() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw RuntimeFault("kolo-bench zero: cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

// Runs `command` through the shell, returns its stdout and exit status.
std::pair<std::string, int> run(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw RuntimeFault("kolo-bench zero: cannot run " + command);
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, got);
  const int status = pclose(pipe);
  return {out, status};
}

// The worker rows in `out` (kolorun may prefix lines).
std::vector<nlohmann::json> rows_of(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (!row.is_discarded() && row.contains("peak_rss_bytes")) rows.push_back(row);
  }
  return rows;
}

std::string mib(int64_t bytes) { return format_fixed(static_cast<double>(bytes) / (1 << 20), 1); }

}  // namespace

int run_zero_bench(const ZeroBenchOptions& options) {
  const std::string self = self_path();
  const std::string kolorun =
      options.kolorun.empty()
          ? (fs::path(self).parent_path().parent_path() / "launcher" / "kolorun").string()
          : options.kolorun;
  Report report;
  const int64_t params = static_cast<int64_t>(options.layers) * options.width * (options.width + 1);
  report.title = "ZeRO: per-rank memory and step time, " + std::to_string(options.layers) +
                 " x Linear(" + std::to_string(options.width) + ", " +
                 std::to_string(options.width) + ") = " + format_fixed(params / 1e6, 1) +
                 " M parameters, Adam, batch " + std::to_string(options.batch) +
                 " per worker, 1 thread per worker";
  report.columns = {"mode",           "workers",        "params MiB",
                    "grads MiB",      "Adam state MiB", "peak params MiB",
                    "peak total MiB", "peak RSS MiB",   "step ms"};
  std::map<std::pair<std::string, int>, nlohmann::json> by_config;
  bool failed = false;
  for (int workers : options.workers) {
    for (const std::string& mode : options.modes) {
      std::ostringstream command;
      command << "'" << kolorun << "' -np " << workers << " --job-timeout "
              << options.config_timeout_s << " '" << self << "' zero --worker --mode " << mode
              << " --layers " << options.layers << " --width " << options.width << " --batch "
              << options.batch << " --steps " << options.steps << " --warmup-steps "
              << options.warmup_steps;
      std::cerr << "kolo-bench zero: mode " << mode << ", " << workers << " worker(s)\n";
      const auto [out, status] = run(command.str());
      const std::vector<nlohmann::json> rows = rows_of(out);
      if (status != 0 || static_cast<int>(rows.size()) != workers) {
        std::cerr << "kolo-bench zero: mode " << mode << " at " << workers
                  << " workers failed (exit status " << status << ", " << rows.size() << " rows):\n"
                  << out;
        failed = true;
        continue;
      }
      // The largest value over the ranks (slices differ by one element).
      nlohmann::json row = {{"mode", mode}, {"world_size", workers}};
      for (const char* key :
           {"param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_param_bytes",
            "peak_grad_bytes", "peak_total_bytes", "peak_rss_bytes"}) {
        int64_t most = 0;
        for (const auto& r : rows) most = std::max(most, r.at(key).get<int64_t>());
        row[key] = most;
      }
      double step_ms = 0;
      for (const auto& r : rows) step_ms = std::max(step_ms, r.at("step_ms").get<double>());
      row["step_ms"] = step_ms;
      by_config[{mode, workers}] = row;
      report.add_row(
          {mode == "ddp" ? "ddp" : "stage " + mode, std::to_string(workers),
           mib(row["param_bytes"]), mib(row["grad_bytes"]), mib(row["optimizer_state_bytes"]),
           mib(row["peak_param_bytes"]), mib(row["peak_total_bytes"]), mib(row["peak_rss_bytes"]),
           format_fixed(step_ms, 0)},
          row);
    }
  }

  // Against the targets: each stage at N workers vs ddp at N workers.
  for (const auto& [key, row] : by_config) {
    const auto& [mode, workers] = key;
    auto ddp = by_config.find({"ddp", workers});
    if (mode == "ddp" || ddp == by_config.end()) continue;
    auto ratio = [&](const char* field) {
      return row.at(field).get<double>() / ddp->second.at(field).get<double>();
    };
    std::ostringstream note;
    note << "stage " << mode << " x" << workers << " / ddp x" << workers << ": Adam state "
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

  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    std::string body = "Command: `" + options.command_line +
                       "` (a plain process: every configuration runs in fresh workers started "
                       "through kolorun)\n\n**" +
                       report.title + "**\n\n" + report.markdown() + "\n";
    write_docs_section(options.docs_path, "zero", body);
    std::cout << "wrote the zero section of " << options.docs_path << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace kolo::bench
