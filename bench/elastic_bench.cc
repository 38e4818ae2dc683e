// `kolo-bench elastic` (elastic_bench.h): kill a worker of an elastic job and
// time the recovery from the job's own output.
#include "elastic_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bench_report.h"
#include "job_driver.h"
#include "kolo/core/errors.h"
#include "worker_runs.h"

namespace kolo::bench {
namespace {

namespace fs = std::filesystem;
using Clock = DriverClock;

struct Measurement {
  int killed_at = 0;      // rank 0's last step when the worker was killed
  int last_old_step = 0;  // last step the old world completed
  int resumed_from = 0;   // the commit the new world started from (steps done)
  int workers_after = 0;
  double step_s = 0;          // median step time before the kill
  double reform_s = 0;        // kill -> kolorun published the next round
  double resume_s = 0;        // -> rank 0 of the new world starts training
  double first_step_s = 0;    // -> its first step completed
  double recovery_s = 0;      // kill -> first step of the new world
  bool finished = false;      // --finish: the job exited 0 after rank 0's summary
  double test_accuracy = -1;  // --finish: rank 0's last "test accuracy"
  std::string error;
};

Measurement measure_once(const ElasticBenchOptions& o, const std::string& kolorun,
                         const std::string& example, int kill_at) {
  const std::vector<std::string> argv = {kolorun,
                                         "-np",
                                         std::to_string(o.workers),
                                         "--min-np",
                                         std::to_string(o.workers - 1),
                                         "--max-restarts",
                                         "1",
                                         "--cooldown",
                                         "3600",
                                         "--job-timeout",
                                         std::to_string(o.run_timeout_s),
                                         example,
                                         "--elastic",
                                         "--commit-every",
                                         std::to_string(o.commit_every),
                                         "--epochs",
                                         std::to_string(o.epochs),
                                         "--train-subset",
                                         std::to_string(o.train_subset),
                                         "--batch-size",
                                         std::to_string(o.batch),
                                         "--threads",
                                         std::to_string(o.threads),
                                         "--test-subset",
                                         "1000",
                                         "--progress-lines",
                                         "1000000",
                                         "--data-dir",
                                         o.data_dir};
  Job job = start_job(argv);
  const std::regex progress(R"(^\s*(\d+)/(\d+) \[)");
  const std::regex round_line(R"(^Round (\d+): (\d+) worker\(s\).*resumes at step (\d+))");
  const std::regex reformed(R"(kolorun: elastic: round (\d+):)");
  const std::regex accuracy(R"(test accuracy: ([0-9.]+))");
  bool summary = false;

  Measurement m;
  std::vector<std::string> tail;  // the job's last lines, for errors
  int round = 0;
  std::vector<Clock::time_point> step_times;
  std::optional<Clock::time_point> killed, reform, resume, first_step;
  int steps_seen_after = 0;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(o.run_timeout_s);
  bool eof = false;
  while (!eof && (o.finish || steps_seen_after < o.steps_after)) {
    if (Clock::now() > deadline) {
      m.error = "no recovery within " + std::to_string(o.run_timeout_s) + " s";
      break;
    }
    for (const Line& line : read_lines(job, 200, &eof)) {
      tail.push_back(line.text);
      if (tail.size() > 12) tail.erase(tail.begin());
      std::smatch match;
      if (line.stream == 1) {
        if (killed && !reform && std::regex_search(line.text, match, reformed) &&
            std::stoi(match[1]) > 1) {
          reform = line.at;
        }
        continue;
      }
      if (std::regex_search(line.text, match, accuracy)) m.test_accuracy = std::stod(match[1]);
      if (line.text.rfind("Summary:", 0) == 0) summary = true;
      if (std::regex_search(line.text, match, round_line)) {
        round = std::stoi(match[1]);
        if (round > 1 && !resume) {
          resume = line.at;
          m.workers_after = std::stoi(match[2]);
          m.resumed_from = std::stoi(match[3]);
        }
        continue;
      }
      if (!std::regex_search(line.text, match, progress)) continue;
      const int step = std::stoi(match[1]);
      if (round <= 1) {
        m.last_old_step = std::max(m.last_old_step, step);
        if (!killed) step_times.push_back(line.at);
        if (!killed && step >= kill_at) {
          const pid_t victim = worker_pid(job.pid, o.workers - 1);
          if (victim <= 0) {
            m.error = "cannot find worker " + std::to_string(o.workers - 1) +
                      " among kolorun's "
                      "children";
            break;
          }
          kill(victim, SIGKILL);
          killed = Clock::now();
          m.killed_at = step;
        }
      } else if (killed) {
        if (!first_step) first_step = line.at;
        ++steps_seen_after;
      }
    }
    if (!m.error.empty()) break;
  }
  int status = 0;
  if (o.finish && eof && m.error.empty()) {
    waitpid(job.pid, &status, 0);
    m.finished = WIFEXITED(status) && WEXITSTATUS(status) == 0 && summary;
    if (!m.finished) m.error = "the job did not finish cleanly after the recovery";
  } else {
    status = stop_job(job);
  }
  if (m.error.empty() && (!killed || !resume || !first_step)) {
    m.error = "the job ended (" +
              (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                 : "signal " + std::to_string(WTERMSIG(status))) +
              ") before " +
              (!killed   ? "the kill step"
               : !resume ? "a new round trained"
                         : "a step after it");
  }
  if (!m.error.empty()) {
    for (const std::string& t : tail) m.error += "\n    | " + t;
    return m;
  }
  // Median step interval over rank 0's lines before the kill (the first few
  // steps warm up).
  std::vector<double> intervals;
  for (size_t i = std::min<size_t>(3, step_times.size()); i + 1 < step_times.size(); ++i) {
    intervals.push_back(seconds_between(step_times[i], step_times[i + 1]));
  }
  if (!intervals.empty()) {
    std::nth_element(intervals.begin(), intervals.begin() + intervals.size() / 2, intervals.end());
    m.step_s = intervals[intervals.size() / 2];
  }
  m.recovery_s = seconds_between(*killed, *first_step);
  if (reform) {
    m.reform_s = seconds_between(*killed, *reform);
    m.resume_s = seconds_between(*reform, *resume);
  } else {
    m.reform_s = -1;  // kolorun's log line was not seen
    m.resume_s = seconds_between(*killed, *resume);
  }
  m.first_step_s = seconds_between(*resume, *first_step);
  return m;
}

}  // namespace

int run_elastic_bench(const ElasticBenchOptions& options) {
  if (options.workers < 2) {
    throw ContractError("kolo-bench elastic: --workers " + std::to_string(options.workers) +
                        " leaves nobody after the kill; give 2 or more");
  }
  if (options.commit_every < 1 || options.repeats < 1 || options.steps_after < 1) {
    throw ContractError(
        "kolo-bench elastic: --commit-every, --repeats and --steps-after must be at least 1");
  }
  const JobPrograms programs = find_job_programs("elastic", options.kolorun, options.example);
  const std::string& kolorun = programs.kolorun;
  const std::string& example = programs.example;
  const int kill_at =
      options.kill_at_step > 0 ? options.kill_at_step : 3 * options.commit_every - 1;

  Report report;
  report.title = "Recovery after SIGKILL of 1 of " + std::to_string(options.workers) +
                 " workers (seed CNN, batch " + std::to_string(options.batch) +
                 " per worker, commit every " + std::to_string(options.commit_every) + " steps)";
  report.columns = {"run",
                    "workers",
                    "killed at step",
                    "resumed from",
                    "lost steps",
                    "step (ms)",
                    "kill -> re-formed (s)",
                    "-> training (s)",
                    "-> first step (s)",
                    "recovery (s)"};
  int failures = 0;
  std::vector<double> recoveries;
  int worst_lost = 0;
  for (int r = 1; r <= options.repeats; ++r) {
    const Measurement m = measure_once(options, kolorun, example, kill_at);
    if (!m.error.empty()) {
      ++failures;
      std::cerr << "kolo-bench elastic: run " << r << ": " << m.error << "\n";
      report.add_row({std::to_string(r), "-", "-", "-", "-", "-", "-", "-", "-", "failed"},
                     {{"run", r}, {"error", m.error}});
      continue;
    }
    const int lost = m.last_old_step - m.resumed_from;
    worst_lost = std::max(worst_lost, lost);
    recoveries.push_back(m.recovery_s);
    nlohmann::json row = {{"run", r},
                          {"recovery_s", m.recovery_s},
                          {"lost_steps", lost},
                          {"commit_interval_steps", options.commit_every},
                          {"workers_before", options.workers},
                          {"workers_after", m.workers_after},
                          {"killed_at_step", m.killed_at},
                          {"last_old_step", m.last_old_step},
                          {"resumed_from_step", m.resumed_from},
                          {"step_s", m.step_s},
                          {"reform_s", m.reform_s},
                          {"resume_s", m.resume_s},
                          {"first_step_s", m.first_step_s}};
    if (options.finish) {
      row["finished"] = m.finished;
      row["test_accuracy"] = m.test_accuracy;
    }
    report.add_row({std::to_string(r),
                    std::to_string(options.workers) + " -> " + std::to_string(m.workers_after),
                    std::to_string(m.killed_at), std::to_string(m.resumed_from),
                    std::to_string(lost), format_fixed(1000 * m.step_s, 0),
                    m.reform_s < 0 ? "-" : format_fixed(m.reform_s, 3), format_fixed(m.resume_s, 3),
                    format_fixed(m.first_step_s, 3), format_fixed(m.recovery_s, 2)},
                   row);
  }
  if (!recoveries.empty()) {
    const double worst = *std::max_element(recoveries.begin(), recoveries.end());
    report.notes.push_back(
        "targets: recovery <= 5 s (worst here " + format_fixed(worst, 2) +
        " s: " + (worst <= 5.0 ? "met" : "missed") + "); lost work <= one commit interval of " +
        std::to_string(options.commit_every) + " steps (worst here " + std::to_string(worst_lost) +
        ": " + (worst_lost <= options.commit_every ? "met" : "missed") + ")");
  }
  report.notes.push_back(
      "the worker with the highest id is killed when rank 0 reports step " +
      std::to_string(kill_at) +
      "; times are the driver's clock when each line arrives: kolorun's `round 2` log line, rank "
      "0's `Round 2 ... resumes at step S` (after join, init, restore and sync) and its step S+1");
  report.notes.push_back(
      "lost steps = the last step the old world completed - S: steps done again");

  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    const std::string body = "## Elastic\n\nCommand: `" + options.command_line +
                             "` (a plain process: it starts kolorun in elastic mode with the "
                             "Fashion-MNIST example, `--elastic`)\n\n**" +
                             report.title + "**\n\n" + report.markdown() + "\n";
    write_docs_section(options.docs_path, "elastic", body);
    std::cout << "wrote the elastic section of " << options.docs_path << "\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace kolo::bench
