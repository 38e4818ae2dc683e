// `kolo-bench chaos` (chaos_bench.h): random SIGKILLs and SIGSTOPs of an
// elastic job's workers, then a fault-free replay of every round.
#include "chaos_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_report.h"
#include "job_driver.h"
#include "kolo/core/errors.h"

namespace kolo::bench {
namespace {

namespace fs = std::filesystem;

// A step of the training: 1-based epoch and the steps done in it.
struct Position {
  int epoch = 0;
  int step = 0;
  bool operator==(const Position& o) const { return epoch == o.epoch && step == o.step; }
  bool operator<(const Position& o) const {
    return epoch != o.epoch ? epoch < o.epoch : step < o.step;
  }
  std::string text() const { return std::to_string(epoch) + ":" + std::to_string(step); }
};

struct Fault {
  int index = 0;     // 1-based
  std::string kind;  // "kill" (SIGKILL) or "stop" (SIGSTOP)
  int worker = 0;    // kolorun's worker id
  pid_t pid = -1;
  int round = 0;  // the round it hit
  DriverClock::time_point at;
  Position last_before;  // rank 0's last step before it
  std::optional<double> detect_s;
  std::optional<double> recovery_s;
  int lost_steps = -1;
};

// One round as the job reported it.
struct Round {
  int workers = 0;                // from kolorun's log
  std::vector<int> ids;           // worker ids by rank
  std::optional<Position> start;  // from rank 0's "Round k ..." line (it trained)
  std::string start_fingerprint;  // rank 0's round_start_params_fnv1a
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, separator);) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += "\n    | " + line;
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

using Paths = JobPrograms;

// The example's arguments shared by the chaos job and its replays.
std::vector<std::string> example_args(const ChaosBenchOptions& o, const std::string& dir) {
  return {"--elastic",
          "--commit-every",
          std::to_string(o.commit_every),
          "--epochs",
          std::to_string(o.epochs),
          "--train-subset",
          std::to_string(o.train_subset),
          "--test-subset",
          std::to_string(o.test_subset),
          "--batch-size",
          std::to_string(o.batch),
          "--threads",
          std::to_string(o.threads),
          "--progress-lines",
          "1000000",
          "--checkpoint-dir",
          dir,
          "--data-dir",
          o.data_dir};
}

struct ChaosRun {
  std::vector<Fault> faults;
  std::map<int, Round> rounds;
  std::string final_fingerprint;
  bool completed = false;
  std::string error;  // why the run did not complete
  std::vector<std::string> leftovers;
  std::vector<std::string> tail;  // last lines of the job
};

ChaosRun run_chaos_job(const ChaosBenchOptions& o, const Paths& paths, const std::string& dir) {
  // Hosts: local aliases, two more than the workers (spare slots while a
  // failed one cools down).
  std::string hosts;
  for (int h = 1; h <= o.workers + 2; ++h) {
    hosts += (hosts.empty() ? "" : ",") + std::string("127.0.0.") + std::to_string(h) + ":1";
  }
  std::vector<std::string> argv = {paths.kolorun,
                                   "-H",
                                   hosts,
                                   "--min-np",
                                   "2",
                                   "--max-np",
                                   std::to_string(o.workers),
                                   "--max-restarts",
                                   "100000",
                                   "--cooldown",
                                   "0.5",
                                   "--timeout",
                                   format_fixed(o.timeout_s, 3),
                                   "--grace",
                                   "1",
                                   "--job-timeout",
                                   std::to_string(o.run_timeout_s),
                                   paths.example};
  const auto args = example_args(o, dir);
  argv.insert(argv.end(), args.begin(), args.end());
  Job job = start_job(argv, {"KOLO_STALL_WARNING_SECONDS=1",
                             "KOLO_STALL_SHUTDOWN_SECONDS=" + format_fixed(o.stall_shutdown_s, 3)});

  const std::regex kolorun_round(
      R"(kolorun: elastic: round (\d+): (\d+) workers? \(ids ([0-9,]+)\))");
  const std::regex lost_worker(
      R"(worker (\d+) \(pid (\d+) on [^)]*\) (killed by signal|did not take part))");
  const std::regex example_round(
      R"(^Round (\d+): (\d+) worker\(s\), \w+ backend; epoch (\d+) resumes at step (\d+))");
  const std::regex start_print(R"(^round_start_params_fnv1a=([0-9a-f]+))");
  const std::regex final_print(R"(^final_params_fnv1a=([0-9a-f]+))");
  const std::regex epoch_line(R"(^Epoch (\d+)/)");
  const std::regex progress(R"(^\s*(\d+)/(\d+) \[)");

  std::mt19937_64 random(o.seed);
  std::vector<std::string> kinds = split(o.kinds, ',');
  std::vector<std::string> schedule = kinds;  // each kind once, in a seeded order...
  std::shuffle(schedule.begin(), schedule.end(), random);
  while (static_cast<int>(schedule.size()) < o.faults) {  // ...then drawn
    schedule.push_back(kinds[std::uniform_int_distribution<size_t>(0, kinds.size() - 1)(random)]);
  }
  schedule.resize(static_cast<size_t>(o.faults));
  std::uniform_real_distribution<double> gap(o.min_gap_s, o.max_gap_s);

  ChaosRun run;
  std::set<pid_t> workers_seen;
  int latest_round = 0;    // published by kolorun
  int training_round = 0;  // the round rank 0 last started
  Position position;       // rank 0's last step
  bool stepped = false;    // rank 0 completed a step in training_round
  // When the next fault is due (meaningful while `scheduled`).
  DriverClock::time_point next_fault =
      DriverClock::now() +
      std::chrono::duration_cast<DriverClock::duration>(std::chrono::duration<double>(gap(random)));
  bool scheduled = true;
  Fault* pending = nullptr;  // injected, not yet recovered from
  DriverClock::time_point last_scan{};
  bool eof = false;
  std::ofstream log;
  if (!o.log_path.empty()) log.open(o.log_path);
  const auto begin = DriverClock::now();
  const auto deadline = DriverClock::now() + std::chrono::seconds(o.run_timeout_s + 30);
  while (!eof) {
    if (DriverClock::now() > deadline) {
      run.error = "the job did not end within " + std::to_string(o.run_timeout_s + 30) + " s";
      break;
    }
    for (const Line& line : read_lines(job, 50, &eof)) {
      if (log.is_open()) {
        log << format_fixed(seconds_between(begin, line.at), 3) << (line.stream ? " E " : " O ")
            << line.text << "\n";
      }
      run.tail.push_back(line.text);
      if (run.tail.size() > 20) run.tail.erase(run.tail.begin());
      std::smatch m;
      if (line.stream == 1) {
        if (std::regex_search(line.text, m, kolorun_round)) {
          const int g = std::stoi(m[1]);
          latest_round = std::max(latest_round, g);
          Round& r = run.rounds[g];
          r.workers = std::stoi(m[2]);
          r.ids.clear();
          for (const auto& id : split(m[3], ',')) r.ids.push_back(std::stoi(id));
        } else if (pending && !pending->detect_s && std::regex_search(line.text, m, lost_worker) &&
                   std::stoi(m[1]) == pending->worker) {
          pending->detect_s = seconds_between(pending->at, line.at);
        }
        continue;
      }
      if (std::regex_search(line.text, m, example_round)) {
        training_round = std::stoi(m[1]);
        const Position start{std::stoi(m[3]), std::stoi(m[4])};
        run.rounds[training_round].start = start;
        if (pending && training_round > pending->round && pending->lost_steps < 0) {
          // Commits are never more than an epoch apart: a resume in another
          // epoch than the last step is the commit at that epoch's end.
          pending->lost_steps =
              position.epoch == start.epoch ? std::max(0, position.step - start.step) : 0;
        }
        position = start;
        stepped = false;
      } else if (std::regex_search(line.text, m, start_print)) {
        run.rounds[training_round].start_fingerprint = m[1];
      } else if (std::regex_search(line.text, m, final_print)) {
        run.final_fingerprint = m[1];
      } else if (std::regex_search(line.text, m, epoch_line)) {
        position = {std::stoi(m[1]), 0};
      } else if (std::regex_search(line.text, m, progress)) {
        position.step = std::stoi(m[1]);
        stepped = true;
        if (pending && training_round > pending->round && !pending->recovery_s) {
          pending->recovery_s = seconds_between(pending->at, line.at);
          if (!pending->detect_s) pending->detect_s = pending->recovery_s;  // not logged
          pending = nullptr;
          next_fault = line.at + std::chrono::duration_cast<DriverClock::duration>(
                                     std::chrono::duration<double>(gap(random)));
          scheduled = true;
        }
      }
    }
    const auto now = DriverClock::now();
    if (now - last_scan > std::chrono::seconds(1)) {
      last_scan = now;
      for (pid_t pid : children_of(job.pid)) workers_seen.insert(pid);
    }
    // Inject the next fault into a world that trains and has nothing pending.
    if (!pending && scheduled && now >= next_fault &&
        static_cast<int>(run.faults.size()) < o.faults && stepped &&
        training_round == latest_round && run.rounds.count(training_round) != 0) {
      const Round& r = run.rounds[training_round];
      const int worker = r.ids[std::uniform_int_distribution<size_t>(0, r.ids.size() - 1)(random)];
      const pid_t pid = worker_pid(job.pid, worker);
      if (pid <= 0) continue;  // not found (yet): try again on the next lines
      Fault fault;
      fault.index = static_cast<int>(run.faults.size()) + 1;
      fault.kind = schedule[run.faults.size()];
      fault.worker = worker;
      fault.pid = pid;
      fault.round = training_round;
      fault.last_before = position;
      workers_seen.insert(pid);
      kill(pid, fault.kind == "stop" ? SIGSTOP : SIGKILL);
      fault.at = DriverClock::now();
      if (log.is_open()) {
        log << format_fixed(seconds_between(begin, fault.at), 3) << " FAULT " << fault.index << " "
            << fault.kind << " worker " << worker << " (pid " << pid << ")\n";
      }
      run.faults.push_back(fault);
      pending = &run.faults.back();
      scheduled = false;
    }
  }
  std::vector<Line> rest;
  const int status = wait_job(job, std::chrono::seconds(30), &rest);
  for (const Line& line : rest) {
    std::smatch m;
    if (std::regex_search(line.text, m, final_print)) run.final_fingerprint = m[1];
    run.tail.push_back(line.text);
  }
  run.completed = run.error.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                  !run.final_fingerprint.empty() && static_cast<int>(run.faults.size()) == o.faults;
  if (run.error.empty() && !run.completed) {
    run.error = "the job ended with " +
                (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                   : "signal " + std::to_string(WTERMSIG(status))) +
                " after " + std::to_string(run.faults.size()) + " of " + std::to_string(o.faults) +
                " faults" + (run.final_fingerprint.empty() ? " and no final parameters" : "");
  }

  // Nothing may be left behind.
  for (pid_t pid : workers_seen) {
    for (int i = 0; i < 50 && kill(pid, 0) == 0; ++i) usleep(100000);  // reaped by kolorun's end
    if (kill(pid, 0) == 0) run.leftovers.push_back("process " + std::to_string(pid));
    for (const auto& entry : fs::directory_iterator("/dev/shm")) {
      const std::string name = entry.path().filename();
      if (name.rfind("kolo-" + std::to_string(pid) + "-", 0) == 0) {
        run.leftovers.push_back("/dev/shm/" + name);
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      run.leftovers.push_back(entry.path().string());
    }
  }
  return run;
}

// One replay: `workers` ranks under plain kolorun, resumed from `start_file`
// (no such file: from the initial model), stopped at `stop` (nullopt: the end).
// Returns rank 0's final fingerprint, or "" with `error` set.
std::string replay(const ChaosBenchOptions& o, const Paths& paths, const std::string& start_file,
                   int workers, const std::optional<Position>& stop, const std::string& dir,
                   std::string* error) {
  fs::create_directories(dir);
  std::vector<std::string> argv = {paths.kolorun, "-np", std::to_string(workers),
                                   "--timeout",   "120", paths.example};
  const auto args = example_args(o, dir);
  argv.insert(argv.end(), args.begin(), args.end());
  if (fs::exists(start_file)) {
    fs::copy_file(start_file, dir + "/elastic.commit", fs::copy_options::overwrite_existing);
    argv.push_back("--resume");
  }
  if (stop) argv.insert(argv.end(), {"--stop-at", stop->text()});
  Job job = start_job(argv);
  std::vector<Line> lines;
  const int status = wait_job(job, std::chrono::seconds(o.run_timeout_s), &lines);
  const std::regex final_print(R"(^final_params_fnv1a=([0-9a-f]+))");
  std::string fingerprint;
  std::vector<std::string> tail;
  for (const Line& line : lines) {
    std::smatch m;
    if (std::regex_search(line.text, m, final_print)) fingerprint = m[1];
    tail.push_back(line.text);
    if (tail.size() > 12) tail.erase(tail.begin());
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || fingerprint.empty()) {
    *error = "replay failed" + join_lines(tail);
    return "";
  }
  return fingerprint;
}

struct ReplayCheck {
  int segments = 0;
  int equal = 0;
  std::vector<std::string> mismatches;
};

ReplayCheck replay_rounds(const ChaosBenchOptions& o, const Paths& paths, const ChaosRun& run,
                          const std::string& dir) {
  ReplayCheck check;
  // Rounds that trained (rank 0 reported their start; it wrote the start
  // file unless the round started from the initial model).
  std::vector<int> trained;
  for (const auto& [g, r] : run.rounds) {
    if (r.start && !r.start_fingerprint.empty()) trained.push_back(g);
  }
  for (size_t i = 0; i < trained.size(); ++i) {
    const int g = trained[i];
    const Round& round = run.rounds.at(g);
    const bool last = i + 1 == trained.size();
    const Round* next = last ? nullptr : &run.rounds.at(trained[i + 1]);
    const std::string expected = last ? run.final_fingerprint : next->start_fingerprint;
    const std::string what = "round " + std::to_string(g) + " (" + std::to_string(round.workers) +
                             " workers, from " + round.start->text() + " to " +
                             (last ? std::string("the end") : next->start->text()) + ")";
    ++check.segments;
    std::string got;
    if (!last && *next->start == *round.start) {
      got = round.start_fingerprint;  // nothing committed in between
    } else if (!last && *next->start < *round.start) {
      check.mismatches.push_back(what + ": the next round resumed from an earlier commit");
      continue;
    } else {
      std::string error;
      got = replay(o, paths, dir + "/round" + std::to_string(g) + ".start", round.workers,
                   last ? std::nullopt : next->start, dir + "/replay" + std::to_string(g), &error);
      if (got.empty()) {
        check.mismatches.push_back(what + ": " + error);
        continue;
      }
    }
    if (got == expected) {
      ++check.equal;
    } else {
      check.mismatches.push_back(what + ": replay " + got + ", chaos run " + expected);
    }
  }
  return check;
}

}  // namespace

int run_chaos_bench(const ChaosBenchOptions& options) {
  const ChaosBenchOptions& o = options;
  if (o.workers < 3) {
    throw ContractError("kolo-bench chaos: --workers " + std::to_string(o.workers) +
                        ": give 3 or more (the job keeps at least 2)");
  }
  if (o.faults < 1 || o.commit_every < 1 || o.min_gap_s < 0 || o.max_gap_s < o.min_gap_s) {
    throw ContractError(
        "kolo-bench chaos: --faults and --commit-every must be at least 1, and 0 <= --min-gap <= "
        "--max-gap");
  }
  for (const auto& kind : split(o.kinds, ',')) {
    if (kind != "kill" && kind != "stop") {
      throw ContractError("kolo-bench chaos: --kinds '" + o.kinds +
                          "': use kill and/or stop, comma-separated");
    }
  }
  if (split(o.kinds, ',').empty()) throw ContractError("kolo-bench chaos: --kinds is empty");
  const Paths paths = find_job_programs("chaos", o.kolorun, o.example);
  std::string pattern = (fs::temp_directory_path() / "kolo-chaos-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    throw RuntimeFault("kolo-bench chaos: mkdtemp: " + std::string(std::strerror(errno)));
  }
  const std::string dir = pattern;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{dir};

  const ChaosRun run = run_chaos_job(o, paths, dir);
  ReplayCheck check;
  if (o.replay && run.completed) check = replay_rounds(o, paths, run, dir);
  const bool replay_ok =
      !o.replay || (run.completed && check.mismatches.empty() && check.segments > 0);

  Report faults;
  faults.title = "Chaos: " + std::to_string(o.faults) +
                 " faults on the elastic Fashion-MNIST "
                 "example (seed CNN), " +
                 std::to_string(o.workers) + " workers (--min-np 2), " + "commit every " +
                 std::to_string(o.commit_every) + " steps, seed " + std::to_string(o.seed);
  faults.columns = {"fault", "kind", "worker", "round", "detect (s)", "recovery (s)", "lost steps"};
  std::map<std::string, std::vector<const Fault*>> by_kind;
  for (const Fault& f : run.faults) {
    by_kind[f.kind].push_back(&f);
    const std::string kind = f.kind == "stop" ? "SIGSTOP" : "SIGKILL";
    faults.add_row({std::to_string(f.index), kind, std::to_string(f.worker),
                    std::to_string(f.round), f.detect_s ? format_fixed(*f.detect_s, 2) : "-",
                    f.recovery_s ? format_fixed(*f.recovery_s, 2) : "-",
                    f.lost_steps >= 0 ? std::to_string(f.lost_steps) : "-"},
                   {{"fault", f.index},
                    {"kind", kind},
                    {"worker", f.worker},
                    {"round", f.round},
                    {"detect_s", f.detect_s ? *f.detect_s : -1.0},
                    {"recovery_s", f.recovery_s ? *f.recovery_s : -1.0},
                    {"lost_steps", f.lost_steps}});
  }

  Report summary;
  summary.title = "Chaos summary (medians; lost steps summed)";
  summary.columns = {"faults",         "kind",       "detect_s", "recovery_s",
                     "max recovery_s", "lost_steps", "completed"};
  auto add_summary = [&](const std::string& kind, const std::vector<const Fault*>& list) {
    std::vector<double> detect, recovery;
    int lost = 0;
    for (const Fault* f : list) {
      if (f->detect_s) detect.push_back(*f->detect_s);
      if (f->recovery_s) recovery.push_back(*f->recovery_s);
      lost += std::max(0, f->lost_steps);
    }
    const double worst =
        recovery.empty() ? -1 : *std::max_element(recovery.begin(), recovery.end());
    summary.add_row({std::to_string(list.size()), kind, format_fixed(median(detect), 2),
                     format_fixed(median(recovery), 2), format_fixed(worst, 2),
                     std::to_string(lost), run.completed ? "yes" : "no"},
                    {{"faults", list.size()},
                     {"kind", kind},
                     {"detect_s", median(detect)},
                     {"recovery_s", median(recovery)},
                     {"max_recovery_s", worst},
                     {"lost_steps", lost},
                     {"completed", run.completed},
                     {"replayed_rounds", check.segments},
                     {"replay_equal", replay_ok},
                     {"leftovers", run.leftovers.size()}});
  };
  std::vector<const Fault*> all;
  for (const auto& [kind, list] : by_kind) {
    add_summary(kind == "stop" ? "SIGSTOP" : "SIGKILL", list);
    all.insert(all.end(), list.begin(), list.end());
  }
  add_summary("all", all);

  const std::string verdict =
      "completed: " + std::string(run.completed ? "yes" : "no: " + run.error) + "; replay: " +
      (!o.replay ? std::string("not asked")
                 : std::to_string(check.equal) + " of " + std::to_string(check.segments) +
                       " rounds reproduced bitwise (FNV-1a of every parameter's bytes; "
                       "tolerance 0)") +
      "; left behind: " +
      (run.leftovers.empty()
           ? std::string("nothing (processes, /dev/shm, *.tmp)")
           : std::to_string(run.leftovers.size()) + " (" + run.leftovers.front() + ", ...)");
  summary.notes.push_back(verdict);
  summary.notes.push_back(
      "detect = fault -> kolorun's log line naming the worker (its death; for SIGSTOP its "
      "eviction); recovery = fault -> rank 0's first step in the next round; lost steps = steps "
      "done again after restoring the last commit");
  summary.notes.push_back(
      "each round is replayed fault-free (plain kolorun, the round's world size) from the state "
      "it started from, to the commit the next round resumed from (the last round: to the end); "
      "its parameters must equal the next round's start (the final ones)");
  for (const auto& m : check.mismatches) std::cerr << "kolo-bench chaos: replay: " << m << "\n";
  if (!run.completed)
    std::cerr << "kolo-bench chaos: " << run.error << join_lines(run.tail) << "\n";

  if (o.json) {
    for (const auto& row : faults.json_rows) std::cout << row.dump() << "\n";
    for (const auto& row : summary.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << faults.text() << "\n" << summary.text() << "\n";
  }
  if (!o.docs_path.empty()) {
    const std::string body = "## Chaos\n\nCommand: `" + o.command_line +
                             "` (a plain process: it starts kolorun in elastic mode with the "
                             "Fashion-MNIST example and injects the faults)\n\n**" +
                             summary.title + "**\n\n" + summary.markdown() + "\n**" + faults.title +
                             "**\n\n" + faults.markdown() + "\n";
    write_docs_section(o.docs_path, "chaos", body);
    std::cout << "wrote the chaos section of " << o.docs_path << "\n";
  }
  return run.completed && replay_ok && run.leftovers.empty() ? 0 : 1;
}

}  // namespace kolo::bench
