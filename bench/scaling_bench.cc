// The driver of `kolo-bench scaling` (see scaling_bench.h). It never loads
// libtorch itself: it starts worker processes, reads their JSON lines and
// builds the table.
#include "scaling_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "bench_report.h"
#include "kolo/core/errors.h"
#include "worker_runs.h"

#ifndef KOLO_SOURCE_DIR
#define KOLO_SOURCE_DIR "."
#endif

namespace kolo::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// One process to start: argv and extra environment variables.
struct Command {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
};

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string out;
};

Child spawn(const Command& command) {
  int fds[2];
  if (pipe(fds) != 0)
    throw RuntimeFault(std::string("kolo-bench scaling: pipe: ") + strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw RuntimeFault(std::string("kolo-bench scaling: fork: ") + strerror(errno));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    setpgid(0, 0);  // its own group, so a timeout stops its children too
    for (const auto& [name, value] : command.env) setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : command.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "kolo-bench scaling: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  setpgid(pid, pid);
  return {pid, fds[0], {}};
}

// Runs the processes side by side until all exit or `timeout_s` passes (then
// they are killed). Returns every process's stdout, or an error message.
struct RunResult {
  std::vector<std::string> outputs;
  std::string error;  // empty when every process exited with 0
};

RunResult run_all(const std::vector<Command>& commands, int timeout_s) {
  std::vector<Child> children;
  for (const Command& c : commands) children.push_back(spawn(c));
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(timeout_s);
  RunResult result;
  size_t open = children.size();
  while (open > 0) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].out_fd < 0) continue;
      fds.push_back({children[i].out_fd, POLLIN, 0});
      which.push_back(i);
    }
    const auto left_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left_ms <= 0) {
      result.error = "timed out after " + std::to_string(timeout_s) + " s";
      break;
    }
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(std::min<long>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& child = children[which[k]];
      char buffer[4096];
      const ssize_t got = read(child.out_fd, buffer, sizeof buffer);
      if (got > 0) {
        child.out.append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(child.out_fd);
        child.out_fd = -1;
        --open;
      }
    }
  }
  for (Child& child : children) {
    if (child.out_fd >= 0) {
      kill(-child.pid, SIGKILL);
      close(child.out_fd);
    }
    int status = 0;
    waitpid(child.pid, &status, 0);
    if (result.error.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      result.error = "a worker failed (" +
                     (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                        : "signal " + std::to_string(WTERMSIG(status))) +
                     "; its stderr is above)";
    result.outputs.push_back(child.out);
  }
  return result;
}

// The JSON objects on the lines of `out` (kolorun may prefix lines).
std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> rows;
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(begin, end - begin);
    const size_t brace = line.find('{');
    if (brace != std::string::npos) {
      nlohmann::json row = nlohmann::json::parse(line.substr(brace), nullptr, false);
      if (!row.is_discarded() && row.contains("images_per_sec")) rows.push_back(row);
    }
    begin = end + 1;
  }
  return rows;
}

struct Config {
  std::string model;
  std::string system;
  int workers = 1;
  int threads = 1;      // per worker
  bool across = false;  // workers spread over ScalingOptions::hosts
};

// The systems that also run across hosts.
bool runs_across_hosts(const std::string& system) {
  return system == "kolo" || system == "kolo_fp16" || system == "pytorch_ddp";
}

// Words of a command line such as "ssh -F /run/kolo-hosts/ssh_config".
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

struct Measurement {
  std::vector<double> images_per_sec;  // one per repeat
  std::vector<double> step_ms;
  // Per repeat: the slowest worker's images/sec (for independent workers, the
  // pace a synchronous system is held to when the cores differ in speed).
  std::vector<double> slowest_worker_images_per_sec;
  // The last run's mean images per step of each worker, by rank
  // ("70.2/57.8"): kolo_balanced's split.
  std::string batches;
  // kolo systems: the most bytes a worker handed to allreduce per step.
  double allreduced_bytes = 0;
  // Per repeat: the resident memory of the configuration's processes, bytes
  // (the sum over distinct pids of each one's peak; 0 = not reported).
  std::vector<double> resident_bytes;
  std::string error;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int free_port() {
  // A port from the ephemeral range chosen by pid and time; collisions on a
  // loopback-only machine are unlikely and fail loudly (the row is marked).
  const auto now = Clock::now().time_since_epoch().count();
  return 29500 + static_cast<int>((getpid() * 7919 + now) % 20000);
}

class Driver {
 public:
  explicit Driver(const ScalingOptions& options) : options_(options), self_(self_path("scaling")) {
    kolorun_ = kolorun_path(options.kolorun, "scaling");
    python_worker_ = options.python_worker.empty()
                         ? std::string(KOLO_SOURCE_DIR) + "/bench/scaling_worker.py"
                         : options.python_worker;
    python_path_ = options.python_path.empty()
                       ? (fs::path(self_).parent_path().parent_path() / "python").string()
                       : options.python_path;
    char templ[] = "/tmp/kolo-scaling-XXXXXX";
    if (!mkdtemp(templ)) throw RuntimeFault("kolo-bench scaling: mkdtemp failed");
    scratch_ = templ;
  }
  ~Driver() {
    std::error_code ec;
    fs::remove_all(scratch_, ec);
  }

  std::vector<Config> configs(std::vector<std::string>* notes) {
    auto wanted = [&](const std::string& system) {
      return std::find(options_.systems.begin(), options_.systems.end(), system) !=
             options_.systems.end();
    };
    const bool have_python = python_runs(options_.python, "import torch.distributed");
    const bool have_kolo_python =
        have_python && python_runs(options_.python, "import kolo.torch", python_path_);
    use_torchrun_ = have_python && torchrun_works(options_.python);
    if (have_python && !use_torchrun_ && wanted("pytorch_ddp"))
      notes->push_back("pytorch_ddp: " + options_.python +
                       "'s torchrun needs torch >= 2.4; its ranks were started by hand with "
                       "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
    if (!have_python && wanted("pytorch_ddp"))
      notes->push_back(
          "pytorch_ddp: not measured (" + options_.python +
          " cannot import torch: bash scripts/setup.sh installs it into .venv, or pass --python)");
    if (!have_kolo_python && wanted("kolo_python"))
      notes->push_back("kolo_python: not measured (" + options_.python +
                       " cannot import kolo.torch from " + python_path_ +
                       ": build kolo for that interpreter (-DKOLO_PYTHON), or pass --python-path)");
    std::vector<Config> list;
    for (const std::string& model : options_.models) {
      for (const std::string& system : options_.systems) {
        if (system == "pytorch_ddp" && !have_python) continue;
        if (system == "kolo_python" && !have_kolo_python) continue;
        if (system == "libtorch_1thread" || system == "libtorch_2threads") {
          list.push_back({model, system, 1, system == "libtorch_2threads" ? 2 : 1});
          continue;
        }
        for (int w : options_.workers) {
          // Nothing to balance, nothing to compress.
          if ((system == "kolo_balanced" || system == "kolo_powersgd" || system == "kolo_fp16" ||
               system == "kolo_bucketview") &&
              w == 1)
            continue;
          list.push_back({model, system, w, options_.threads});
          const int hosts = static_cast<int>(options_.hosts.size());
          if (hosts > 1 && runs_across_hosts(system) && w % hosts == 0)
            list.push_back({model, system, w, options_.threads, true});
        }
      }
    }
    return list;
  }

  Measurement* measure_once(const Config& config, Measurement* m, int repeat) {
    const int batch = config.model == "cnn" ? options_.cnn_batch : options_.mlp_batch;
    std::vector<std::string> worker_args = {"scaling",        "--worker",
                                            "--model",        config.model,
                                            "--steps",        std::to_string(options_.steps),
                                            "--warmup-steps", std::to_string(options_.warmup_steps),
                                            "--threads",      std::to_string(config.threads),
                                            "--batch-size",   std::to_string(batch),
                                            "--data-dir",     options_.data_dir};
    if (options_.synthetic) worker_args.push_back("--synthetic");
    const std::string threads = std::to_string(config.threads);
    const std::vector<std::pair<std::string, std::string>> thread_env = {
        {"OMP_NUM_THREADS", threads},
        {"OPENBLAS_NUM_THREADS", threads},
        {"MKL_NUM_THREADS", threads},
        // The same allocator settings for every system (the example sets them
        // with mallopt): glibc's dynamic mmap threshold otherwise hands large
        // tensors back to the kernel each step, and page faults then dominate
        // whichever system happens to trip it.
        {"MALLOC_MMAP_THRESHOLD_", "33554432"},
        {"MALLOC_TRIM_THRESHOLD_", "1073741824"},
        // ...and kolorun's allocator default (launcher/worker_env.h) for the
        // systems it does not start too: transparent huge pages for the
        // blocks of 32 MiB and more that are still mapped afresh every step.
        {"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}};

    std::vector<Command> commands;
    const std::string tag = config.model + "-" + config.system + "-" +
                            std::to_string(config.workers) + (config.across ? "-hosts-" : "-") +
                            std::to_string(repeat);
    // Across hosts: kolorun's placement and ssh, and the worker environment
    // passed on with -x (remote workers get only what kolorun forwards).
    std::vector<std::string> placement;
    const int per_host =
        config.across ? config.workers / static_cast<int>(options_.hosts.size()) : 0;
    if (config.across) {
      std::string list;
      for (const std::string& host : options_.hosts)
        list += (list.empty() ? "" : ",") + host + ":" + std::to_string(per_host);
      placement = {"-H", list, "--ssh-command", options_.ssh_command};
      for (const auto& [name, value] : thread_env) {
        placement.insert(placement.end(), {"-x", name + "=" + value});
      }
    }
    if (config.system == "kolo_mirrored") {
      // One process, the workers as its replicas.
      Command c{
          {kolorun_, "-np", "1", "--job-timeout", std::to_string(options_.config_timeout_s), self_},
          thread_env};
      c.argv.insert(c.argv.end(), worker_args.begin(), worker_args.end());
      c.argv.insert(c.argv.end(),
                    {"--system", "kolo", "--replicas", std::to_string(config.workers)});
      if (options_.bucket_bytes >= 0)
        c.argv.insert(c.argv.end(), {"--bucket-bytes", std::to_string(options_.bucket_bytes)});
      commands.push_back(c);
    } else if (config.system == "kolo" || config.system == "kolo_balanced" ||
               config.system == "kolo_powersgd" || config.system == "kolo_fp16" ||
               config.system == "kolo_bucketview") {
      Command c{{kolorun_, "-np", std::to_string(config.workers), "--job-timeout",
                 std::to_string(options_.config_timeout_s)},
                thread_env};
      c.argv.insert(c.argv.end(), placement.begin(), placement.end());
      c.argv.push_back(self_);
      c.argv.insert(c.argv.end(), worker_args.begin(), worker_args.end());
      c.argv.insert(c.argv.end(), {"--system", "kolo"});
      if (config.system == "kolo_balanced") c.argv.push_back("--balance");
      if (config.system == "kolo_powersgd")
        c.argv.insert(c.argv.end(), {"--powersgd-rank", std::to_string(options_.powersgd_rank)});
      if (config.system == "kolo_fp16") c.argv.insert(c.argv.end(), {"--compression", "fp16"});
      if (config.system == "kolo_bucketview") c.argv.push_back("--bucket-view");
      if (options_.bucket_bytes >= 0)
        c.argv.insert(c.argv.end(), {"--bucket-bytes", std::to_string(options_.bucket_bytes)});
      commands.push_back(c);
    } else if (config.system == "kolo_python" || config.system == "pytorch_ddp") {
      // Both Python systems run bench/scaling_worker.py, the same loop and
      // models: kolo's under kolorun, DDP's ranks started here.
      const bool kolo = config.system == "kolo_python";
      std::vector<std::string> python_args = {
          options_.python,  python_worker_,
          "--system",       kolo ? "kolo" : "ddp",
          "--model",        config.model,
          "--steps",        std::to_string(options_.steps),
          "--warmup-steps", std::to_string(options_.warmup_steps),
          "--threads",      threads,
          "--batch-size",   std::to_string(batch),
          "--data-dir",     options_.data_dir};
      if (options_.synthetic) python_args.push_back("--synthetic");
      if (kolo && options_.bucket_bytes >= 0)
        python_args.insert(python_args.end(),
                           {"--bucket-bytes", std::to_string(options_.bucket_bytes)});
      if (kolo) {
        Command c{{kolorun_, "-np", std::to_string(config.workers), "--job-timeout",
                   std::to_string(options_.config_timeout_s)},
                  thread_env};
        c.argv.insert(c.argv.end(), python_args.begin(), python_args.end());
        c.env.emplace_back("PYTHONPATH", python_path_);
        commands.push_back(c);
      }
      // DDP's ranks: the real torchrun, as a PyTorch user starts them (one
      // per host across hosts, a static rendezvous at the first host), or
      // by hand where the interpreter's torchrun is too old.
      const std::string port = std::to_string(free_port());
      if (!kolo && use_torchrun_) {
        const int hosts = config.across ? static_cast<int>(options_.hosts.size()) : 1;
        for (int h = 0; h < hosts; ++h) {
          std::vector<std::string> run = torchrun_argv(options_.python, config.workers);
          if (config.across) {
            run = {options_.python,
                   "-m",
                   "torch.distributed.run",
                   "--nnodes",
                   std::to_string(hosts),
                   "--node-rank",
                   std::to_string(h),
                   "--master-addr",
                   options_.hosts[0],
                   "--master-port",
                   port,
                   "--nproc-per-node",
                   std::to_string(per_host)};
          }
          run.insert(run.end(), python_args.begin() + 1, python_args.end());  // without python
          if (!config.across) {
            commands.push_back({run, thread_env});
            continue;
          }
          Command c{split_words(options_.ssh_command), {}};
          c.argv.insert(c.argv.end(), {options_.hosts[h], "env"});
          for (const auto& [name, value] : thread_env) c.argv.push_back(name + "=" + value);
          c.argv.insert(c.argv.end(), run.begin(), run.end());
          commands.push_back(c);
        }
      }
      for (int r = 0; !kolo && !use_torchrun_ && r < config.workers; ++r) {
        std::vector<std::pair<std::string, std::string>> env = thread_env;
        env.insert(env.end(), {{"RANK", std::to_string(r)},
                               {"WORLD_SIZE", std::to_string(config.workers)},
                               {"MASTER_ADDR", config.across ? options_.hosts[0] : "127.0.0.1"},
                               {"MASTER_PORT", port}});
        if (!config.across) {
          commands.push_back({python_args, env});
          continue;
        }
        // By hand on its host: ssh HOST env NAME=VALUE... python3 worker args.
        Command c{split_words(options_.ssh_command), {}};
        c.argv.insert(c.argv.end(), {options_.hosts[r / per_host], "env"});
        for (const auto& [name, value] : env) c.argv.push_back(name + "=" + value);
        c.argv.insert(c.argv.end(), python_args.begin(), python_args.end());
        commands.push_back(c);
      }
    } else {
      // independent: N unrelated processes (WORLD_SIZE only picks disjoint
      // data); libtorch_*: one process; c10d_gloo: N processes in a group.
      const bool c10d = config.system == "c10d_gloo";
      const std::string sync_dir = scratch_ + "/sync-" + tag;  // the workers' file store
      for (int r = 0; r < config.workers; ++r) {
        Command c{{self_}, thread_env};
        c.argv.insert(c.argv.end(), worker_args.begin(), worker_args.end());
        c.argv.insert(c.argv.end(), {"--system", c10d ? "c10d_gloo" : "local"});
        if (c10d) c.argv.insert(c.argv.end(), {"--store-path", scratch_ + "/store-" + tag});
        if (config.system == "independent")
          c.argv.insert(c.argv.end(), {"--sync-dir", sync_dir, "--config-timeout",
                                       std::to_string(options_.config_timeout_s)});
        c.env.insert(c.env.end(),
                     {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(config.workers)}});
        commands.push_back(c);
      }
    }
    const RunResult run = run_all(commands, options_.config_timeout_s);
    double ips = 0, step_ms = 0;
    double slowest = std::numeric_limits<double>::infinity();
    int ranks = 0;
    std::map<int, double> batches;   // by rank
    std::map<int, double> resident;  // by pid
    for (const std::string& out : run.outputs) {
      for (const nlohmann::json& row : json_lines(out)) {
        if (row.contains("pid"))
          resident[row.at("pid").get<int>()] = row.value("resident_bytes", 0.0);
        batches[row.value("rank", ranks)] = row.value("batch", 0.0);
        m->allreduced_bytes =
            std::max(m->allreduced_bytes, row.value("allreduced_bytes_per_step", 0.0));
        ips += row.at("images_per_sec").get<double>();
        slowest = std::min(slowest, row.at("images_per_sec").get<double>());
        step_ms = std::max(step_ms, row.at("step_ms").get<double>());
        ++ranks;
      }
    }
    if (!run.error.empty() || ranks != config.workers) {
      m->error = run.error.empty() ? "got " + std::to_string(ranks) + " of " +
                                         std::to_string(config.workers) + " workers' results"
                                   : run.error;
      std::cerr << "kolo-bench scaling: " << tag << ": " << m->error << "\n";
      return m;
    }
    m->images_per_sec.push_back(ips);
    m->step_ms.push_back(step_ms);
    m->slowest_worker_images_per_sec.push_back(slowest);
    double resident_sum = 0;
    for (const auto& [pid, bytes] : resident) resident_sum += bytes;
    m->resident_bytes.push_back(resident_sum);
    m->batches.clear();
    for (const auto& [rank, b] : batches)
      m->batches += (m->batches.empty() ? "" : "/") + format_fixed(b, 1);
    return m;
  }

 private:
  ScalingOptions options_;
  std::string self_;
  std::string kolorun_;
  std::string python_worker_;
  std::string python_path_;
  bool use_torchrun_ = false;  // pytorch_ddp's ranks through the interpreter's torchrun
  std::string scratch_;
};

std::string config_key(const std::string& model, const std::string& system, int workers,
                       bool across = false) {
  return model + "/" + system + "/" + std::to_string(workers) + (across ? "/hosts" : "");
}

void write_plot(const ScalingOptions& options, const std::vector<nlohmann::json>& rows,
                std::vector<std::string>* notes) {
  // One data block per (model, system) with more than one worker count.
  std::map<std::string, std::vector<const nlohmann::json*>> series;
  for (const nlohmann::json& row : rows) {
    if (row["system"] == "libtorch_1thread" || row["system"] == "libtorch_2threads") continue;
    series[row["model"].get<std::string>() + " " + row["system"].get<std::string>()].push_back(
        &row);
  }
  const std::string data_path = options.plot_path + ".dat";
  {
    std::ofstream data(data_path);
    for (const auto& [name, points] : series) {
      data << "\"" << name << "\" \"images/sec\" \"efficiency\"\n";
      for (const nlohmann::json* p : points)
        data << (*p)["workers"].get<int>() << " " << (*p)["images_per_sec"].get<double>() << " "
             << (*p)["efficiency"].get<double>() << "\n";
      data << "\n\n";
    }
  }
  const std::string script = std::string(KOLO_SOURCE_DIR) + "/bench/plot_scaling.gnuplot";
  const std::string command = "gnuplot -e \"datafile='" + data_path + "'; outfile='" +
                              options.plot_path + "'; nseries=" + std::to_string(series.size()) +
                              "\" '" + script + "'";
  if (std::system(command.c_str()) == 0) {
    notes->push_back("plot: " + options.plot_path + " (data " + data_path + ")");
  } else {
    std::cerr << "kolo-bench scaling: gnuplot failed: " << command << "\n";
  }
}

}  // namespace

int run_scaling_bench(const ScalingOptions& options) {
  Driver driver(options);
  std::vector<std::string> notes;
  const std::vector<Config> configs = driver.configs(&notes);
  std::vector<Measurement> measurements(configs.size());
  // Interleaved: every configuration once per pass, so a slow spell of the
  // shared machine hits all systems alike. Within a pass the configurations
  // that the targets compare run next to each other (grouped by model and
  // worker count: kolo x2 beside independent x2, kolo x1 beside libtorch),
  // because this machine's speed drifts over the minutes a pass takes; and
  // every other pass runs in reverse, so no system always follows the same
  // neighbour (a 4-worker run, a Python start-up) or always goes first.
  // The table keeps configs' order.
  std::vector<size_t> run_order(configs.size());
  std::iota(run_order.begin(), run_order.end(), size_t{0});
  std::stable_sort(run_order.begin(), run_order.end(), [&](size_t a, size_t b) {
    auto position = [&](const std::string& model) {
      return std::find(options.models.begin(), options.models.end(), model) -
             options.models.begin();
    };
    return std::make_pair(position(configs[a].model), configs[a].workers) <
           std::make_pair(position(configs[b].model), configs[b].workers);
  });
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    for (size_t k = 0; k < run_order.size(); ++k) {
      const size_t i = run_order[repeat % 2 ? run_order.size() - 1 - k : k];
      if (!measurements[i].error.empty()) continue;
      const std::string where = configs[i].across ? " on the hosts" : "";
      std::cerr << "kolo-bench scaling: pass " << repeat + 1 << "/" << options.repeats << ": "
                << configs[i].model << " " << configs[i].system << " x" << configs[i].workers
                << where << "\n";
      driver.measure_once(configs[i], &measurements[i], repeat);
      // Each pass's figure, so that a run's spread (and which neighbour a
      // slow figure followed) can be read from the log; the table has medians.
      if (measurements[i].error.empty() && !measurements[i].images_per_sec.empty())
        std::cerr << "kolo-bench scaling:   " << configs[i].model << " " << configs[i].system
                  << " x" << configs[i].workers << where << ": "
                  << format_fixed(measurements[i].images_per_sec.back(), 1) << " images/sec\n";
    }
  }

  std::map<std::string, double> ips;      // by config_key
  std::map<std::string, double> slowest;  // by config_key: the slowest worker's images/sec
  for (size_t i = 0; i < configs.size(); ++i) {
    if (measurements[i].error.empty() && !measurements[i].images_per_sec.empty()) {
      const std::string key =
          config_key(configs[i].model, configs[i].system, configs[i].workers, configs[i].across);
      ips[key] = median(measurements[i].images_per_sec);
      slowest[key] = median(measurements[i].slowest_worker_images_per_sec);
    }
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  Report report;
  report.title = "Training throughput: " + std::to_string(options.steps) + " timed steps after " +
                 std::to_string(options.warmup_steps) + " warm-up steps, median of " +
                 std::to_string(options.repeats) + " interleaved passes; " +
                 (options.synthetic ? "synthetic data" : "Fashion-MNIST") + ", " +
                 std::to_string(cores) + " cores";
  report.columns = {"model",          "system",      "workers", "threads/worker",
                    "batch/worker",   "images/sec",  "step ms", "efficiency",
                    "vs independent", "resident MB", "note"};
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const Measurement& m = measurements[i];
    const int batch = c.model == "cnn" ? options.cnn_batch : options.mlp_batch;
    const bool oversubscribed = static_cast<unsigned>(c.workers * c.threads) > cores;
    std::string note = oversubscribed ? "oversubscribed" : "";
    if (c.across)
      note += std::string(note.empty() ? "" : ", ") + std::to_string(options.hosts.size()) +
              " hosts" + (options.link.empty() ? "" : " (" + options.link + ")");
    if (c.system == "kolo") note += std::string(note.empty() ? "" : ", ") + "DistributedOptimizer";
    if (c.system == "kolo_fp16")
      note += std::string(note.empty() ? "" : ", ") + "DistributedOptimizer, fp16 compression";
    if (c.system == "kolo_bucketview")
      note +=
          std::string(note.empty() ? "" : ", ") + "DistributedOptimizer, gradient_as_bucket_view";
    if (c.system == "kolo_python")
      note += std::string(note.empty() ? "" : ", ") + "hvd.DistributedOptimizer (Python)";
    if (c.system == "kolo_mirrored")
      note +=
          std::string(note.empty() ? "" : ", ") + "1 process, workers = MirroredStrategy replicas";
    if (c.system == "kolo_powersgd")
      note += std::string(note.empty() ? "" : ", ") + "PowerSGD rank " +
              std::to_string(options.powersgd_rank);
    if (m.allreduced_bytes > 0)
      note += std::string(note.empty() ? "" : ", ") + format_fixed(m.allreduced_bytes / 1e6, 2) +
              " MB allreduced/step/worker";
    if (c.system == "kolo_balanced" && !m.batches.empty())
      note +=
          std::string(note.empty() ? "" : ", ") + "BatchBalancer, images/step by rank " + m.batches;
    nlohmann::json row = {{"model", c.model},
                          {"system", c.system},
                          {"workers", c.workers},
                          {"threads_per_worker", c.threads},
                          {"batch_per_worker", batch},
                          {"oversubscribed", oversubscribed},
                          {"hosts", c.across ? static_cast<int>(options.hosts.size()) : 1},
                          {"link", c.across ? options.link : "this host"}};
    if (!m.error.empty() || m.images_per_sec.empty()) {
      row["error"] = m.error;
      report.add_row({c.model, c.system, std::to_string(c.workers), std::to_string(c.threads),
                      std::to_string(batch), "-", "-", "-", "-", "-", "failed: " + m.error},
                     row);
      continue;
    }
    const double value = median(m.images_per_sec);
    // Classic efficiency: against workers x the 1-worker kolo figure.
    const auto base = ips.find(config_key(c.model, "kolo", 1));
    const double efficiency = base != ips.end() ? value / (c.workers * base->second) : 0.0;
    const auto ceiling = ips.find(config_key(c.model, "independent", c.workers));
    const double vs_ceiling = ceiling != ips.end() ? value / ceiling->second : 0.0;
    row["images_per_sec"] = value;
    row["step_ms"] = median(m.step_ms);
    row["efficiency"] = efficiency;
    row["efficiency_vs_independent"] = vs_ceiling;
    row["runs"] = m.images_per_sec;
    if (c.system == "independent")
      row["slowest_worker_images_per_sec"] = median(m.slowest_worker_images_per_sec);
    if (m.allreduced_bytes > 0) row["allreduced_bytes_per_step"] = m.allreduced_bytes;
    const double resident = m.resident_bytes.empty() ? 0.0 : median(m.resident_bytes);
    if (resident > 0) row["resident_bytes_per_host"] = resident;
    report.add_row(
        {c.model, c.system, std::to_string(c.workers), std::to_string(c.threads),
         std::to_string(batch), format_fixed(value, 1), format_fixed(median(m.step_ms), 1),
         base != ips.end() ? format_fixed(100 * efficiency, 1) + "%" : "-",
         ceiling != ips.end() ? format_fixed(100 * vs_ceiling, 1) + "%" : "-",
         resident > 0 ? format_fixed(resident / 1e6, 0) : "-", note},
        row);
  }
  report.notes.push_back(
      "resident MB = the sum over the configuration's processes of each one's peak resident "
      "set (VmHWM), all on this host: kolo_mirrored is one process for all its workers");
  report.notes.push_back(
      "efficiency = images/sec / (workers x kolo's 1-worker images/sec); vs independent = "
      "images/sec / that of the same number of independent processes (no gradient exchange: "
      "the machine's ceiling)");
  // The ratios, per model: kolo against each baseline.
  for (const std::string& model : options.models) {
    auto ratio = [&](const std::string& what, const std::string& system, int workers,
                     const std::string& base_system, int base_workers, bool across = false,
                     bool base_across = false) {
      const auto a = ips.find(config_key(model, system, workers, across));
      const auto b = ips.find(config_key(model, base_system, base_workers, base_across));
      if (a == ips.end() || b == ips.end()) return;
      report.notes.push_back(model + ": " + what + " = " + format_fixed(a->second / b->second, 2) +
                             "x");
    };
    ratio("kolo x1 / libtorch_1thread", "kolo", 1, "libtorch_1thread", 1);
    ratio("kolo x2 / libtorch_2threads", "kolo", 2, "libtorch_2threads", 1);
    ratio("kolo x2 / independent x2", "kolo", 2, "independent", 2);
    ratio("kolo_balanced x2 / independent x2", "kolo_balanced", 2, "independent", 2);
    ratio("kolo_balanced x2 / kolo x2", "kolo_balanced", 2, "kolo", 2);
    ratio("kolo_bucketview x2 / independent x2", "kolo_bucketview", 2, "independent", 2);
    ratio("kolo_bucketview x2 / kolo x2", "kolo_bucketview", 2, "kolo", 2);
    ratio("kolo_powersgd x2 / kolo x2", "kolo_powersgd", 2, "kolo", 2);
    ratio("kolo_mirrored x2 / kolo x2", "kolo_mirrored", 2, "kolo", 2);
    ratio("kolo_mirrored x4 / kolo x4", "kolo_mirrored", 4, "kolo", 4);
    // Across hosts (the same workers on this machine are the reference).
    const int h = static_cast<int>(options.hosts.size());
    if (h > 1) {
      const std::string x = " x" + std::to_string(h);
      const std::string on_hosts = x + " on " + std::to_string(h) + " hosts";
      ratio("kolo" + on_hosts + " / kolo" + x + " on this host", "kolo", h, "kolo", h, true);
      ratio("pytorch_ddp" + on_hosts + " / pytorch_ddp" + x + " on this host", "pytorch_ddp", h,
            "pytorch_ddp", h, true);
      ratio("kolo" + on_hosts + " / pytorch_ddp" + on_hosts, "kolo", h, "pytorch_ddp", h, true,
            true);
      ratio("kolo_fp16" + on_hosts + " / kolo" + on_hosts, "kolo_fp16", h, "kolo", h, true, true);
      ratio("kolo_fp16" + on_hosts + " / pytorch_ddp" + on_hosts, "kolo_fp16", h, "pytorch_ddp", h,
            true, true);
    }
    ratio("kolo x2 / c10d_gloo x2", "kolo", 2, "c10d_gloo", 2);
    ratio("kolo x2 / pytorch_ddp x2", "kolo", 2, "pytorch_ddp", 2);
    ratio("kolo_python x2 / kolo x2", "kolo_python", 2, "kolo", 2);
    ratio("kolo_python x2 / pytorch_ddp x2", "kolo_python", 2, "pytorch_ddp", 2);
    ratio("kolo_python x1 / kolo x1", "kolo_python", 1, "kolo", 1);
    ratio("independent x2 / independent x1", "independent", 2, "independent", 1);
    // Synchronous data parallelism runs at its slowest worker's pace: when the
    // cores differ in speed (this VM's two do, by ~20%), the sum of the
    // independent workers' rates is out of its reach, and workers x the
    // slowest independent worker is the ceiling it can meet.
    const auto sync = slowest.find(config_key(model, "independent", 2));
    const auto kolo2 = ips.find(config_key(model, "kolo", 2));
    const auto ind2 = ips.find(config_key(model, "independent", 2));
    if (sync != slowest.end() && kolo2 != ips.end() && ind2 != ips.end()) {
      const double fastest = ind2->second - sync->second;
      const auto views2 = ips.find(config_key(model, "kolo_bucketview", 2));
      report.notes.push_back(
          model + ": independent x2 workers ran at " + format_fixed(sync->second, 1) + " and " +
          format_fixed(fastest, 1) + " images/sec (the faster " +
          format_fixed(100 * (fastest / sync->second - 1), 1) +
          "% faster); kolo x2 / (2 x the slower) = " +
          format_fixed(kolo2->second / (2 * sync->second), 2) + "x (the synchronous ceiling)" +
          (views2 == ips.end() ? std::string()
                               : "; kolo_bucketview x2 / (2 x the slower) = " +
                                     format_fixed(views2->second / (2 * sync->second), 2) + "x"));
    }
  }
  if (std::any_of(options.workers.begin(), options.workers.end(),
                  [&](int w) { return static_cast<unsigned>(w * options.threads) > cores; }))
    report.notes.push_back("oversubscribed rows run more worker threads than the " +
                           std::to_string(cores) + " cores");
  report.notes.insert(report.notes.end(), notes.begin(), notes.end());

  if (!options.plot_path.empty()) write_plot(options, report.json_rows, &report.notes);
  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    std::string body = "Command: `" + options.command_line +
                       "` (a plain process: it starts every configuration's workers itself, "
                       "kolo's through kolorun)\n\n**" +
                       report.title + "**\n\n" + report.markdown() + "\n";
    // Across hosts, a section per link ("scaling-hosts-1gbit").
    const std::string section =
        options.hosts.size() > 1 ? "scaling-hosts-" + (options.link.empty() ? "link" : options.link)
                                 : "scaling";
    write_docs_section(options.docs_path, section, body);
    std::cout << "wrote the " << section << " section of " << options.docs_path << "\n";
  }
  for (const Measurement& m : measurements)
    if (!m.error.empty()) return 1;
  return 0;
}

}  // namespace kolo::bench
