// kolorun: the process launcher (docs/kolorun.md).
//
// main() parses the command line, plans the job (nothing is spawned when an
// argument is wrong), serves the rendezvous store, spawns the workers and hands
// them to the Supervisor, which pumps their output and stops them all when one
// fails or kolorun is signalled. `--backend mpi` execs mpirun instead.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <system_error>

#include "build_info.h"
#include "crypto.h"
#include "elastic_driver.h"
#include "elastic_hosts.h"
#include "exit_notices.h"
#include "hosts.h"
#include "job.h"
#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/store.h"
#include "kolo/core/topology.h"
#include "mpi_launch.h"
#include "options.h"
#include "remote_check.h"
#include "spawn.h"
#include "supervisor.h"
#include "usage_error.h"
#include "worker_env.h"

namespace kolo::launcher {
namespace {

// Exit code for a bad command line (nothing was started).
constexpr int kUsageExitCode = 2;

// Workers' pipes must never land on fds 0-2, so make sure those are open.
void ensure_standard_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int null_fd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null_fd >= 0 && null_fd != fd) {
        dup2(null_fd, fd);
        close(null_fd);
      }
    }
  }
}

std::string working_directory() {
  char buffer[4096];
  if (getcwd(buffer, sizeof(buffer)) == nullptr) return ".";
  return buffer;
}

// This kolorun's absolute path (remote hosts run the same one).
std::string self_path() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "kolorun";
}

std::string describe_request(const Placement& p, const SpawnRequest& request,
                             const std::vector<std::string>& parent_environ) {
  std::string line = "kolorun: rank " + std::to_string(p.rank) + " on " + p.host + ":";
  if (p.local) {
    // Print only what kolorun added or changed, not the inherited environment.
    std::vector<std::string> inherited(parent_environ.begin(), parent_environ.end());
    for (const auto& entry : request.env) {
      if (std::find(inherited.begin(), inherited.end(), entry) == inherited.end()) {
        line += " " + entry;
      }
    }
  }
  for (const auto& arg : request.argv) line += " " + arg;
  return line;
}

int exec_mpirun(const LaunchOptions& options, const JobPlan& plan) {
  std::vector<std::string> argv =
      mpirun_command(options, plan.hosts, default_mpirun(), usable_cores(), current_environ(),
                     process_parent_env());
  if (options.verbose) {
    std::string line = "kolorun: exec";
    for (const auto& arg : argv) line += " " + arg;
    std::cerr << line << std::endl;
  }
  std::vector<char*> args;
  for (auto& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  sigset_t set = kolorun_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_DFL);
  execvp(args[0], args.data());
  std::cerr << "kolorun: --backend mpi: cannot run '" << argv[0] << "': " << std::strerror(errno)
            << " (install openmpi-bin, or use --backend gloo)" << std::endl;
  return 127;
}

// The store server's reports (a connection with a bad tag, connections
// refused at KOLO_STORE_MAX_CONNECTIONS), from the server's thread: one
// write(2) keeps the line whole.
std::function<void(const std::string&)> store_reporter(const std::string& prefix) {
  return [prefix](const std::string& message) {
    const std::string line = prefix + message + "\n";
    if (write(2, line.data(), line.size()) < 0) {
      // stderr closed: nothing else to tell
    }
  };
}

// Prints the job's report (and incomplete --output-dir logs, which make an
// otherwise successful job fail, as tee does); returns kolorun's exit code.
int report(const Outcome& outcome, const OutputRouter& output) {
  if (!outcome.report.empty()) std::cerr << outcome.report << std::endl;
  const std::string lost = output.log_failures();
  if (lost.empty()) return outcome.exit_code;
  std::cerr << lost << (outcome.exit_code == 0 ? "; the workers themselves succeeded" : "")
            << std::endl;
  return outcome.exit_code == 0 ? 1 : outcome.exit_code;
}

// A fresh per-job secret for the rendezvous: 256 random bits as 64 hex digits.
std::string make_secret() {
  const std::string bytes = detail::random_bytes(32);
  return detail::to_hex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// Elastic mode (elastic_driver.h): kolorun serves an authenticated
// rendezvous and re-forms the world as workers fail or hosts appear.
int launch_elastic(const LaunchOptions& options) {
  std::vector<HostSlots> hosts;
  if (!options.hosts.empty()) hosts = parse_host_list(options.hosts);
  const std::string hostname = this_hostname();
  const std::string path = process_parent_env()("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  const std::string error = check_elastic_options(options, hosts);
  if (!error.empty()) throw UsageError(error);
  const auto compiled = compiled_backends();
  if (!options.backend.empty() &&
      std::find(compiled.begin(), compiled.end(), options.backend) == compiled.end()) {
    throw UsageError("--backend " + options.backend + ": this build of kolo has no " +
                     options.backend + " backend (see kolorun --check-build)");
  }
  ElasticSetup setup;
  setup.options = &options;
  setup.hosts = hosts;
  setup.this_hostname = hostname;
  setup.program_path = find_executable(options.program, path);
  if (setup.program_path.empty()) {
    throw UsageError("program '" + options.program + "' " + why_not_executable(options.program));
  }
  if (!options.host_discovery_script.empty() &&
      find_executable(options.host_discovery_script, path).empty()) {
    throw UsageError("--host-discovery-script '" + options.host_discovery_script + "' " +
                     why_not_executable(options.host_discovery_script));
  }
  // Hosts may appear anywhere when a discovery script names them: the
  // (authenticated) rendezvous then listens on every interface, at the
  // address the first remote host known now reaches (the script's first
  // answer; the driver reports a script that fails).
  std::vector<std::string> remote_hosts;
  for (const auto& h : hosts) {
    if (!is_local_host(h.name, hostname)) remote_hosts.push_back(h.name);
  }
  if (!options.host_discovery_script.empty()) {
    try {
      for (const auto& h : run_discovery_script(
               find_executable(options.host_discovery_script, path), std::chrono::seconds(10))) {
        if (!is_local_host(h.name, hostname)) remote_hosts.push_back(h.name);
      }
    } catch (const std::exception&) {
      // reported by the driver when it runs the script
    }
  }
  const bool remote = !options.store_addr.empty() || !options.host_discovery_script.empty() ||
                      !remote_hosts.empty();

  OutputRouter::Options output_options;
  output_options.mode = options.output;
  output_options.output_dir = options.output_dir;
  std::unique_ptr<OutputRouter> output;
  try {
    output = std::make_unique<OutputRouter>(output_options, 0);
  } catch (const std::system_error& e) {
    throw UsageError("--output-dir " + options.output_dir + ": " + e.what());
  }
  const std::string secret = make_secret();
  std::unique_ptr<TcpStoreServer> server;
  TcpStoreServer::Options store_options;
  store_options.bind_address = remote ? "0.0.0.0" : "127.0.0.1";
  store_options.secret = secret;
  store_options.on_reject = store_reporter("kolorun: elastic: rendezvous: ");
  try {
    store_limits_from(Config::load(process_env()), store_options);
    server = std::make_unique<TcpStoreServer>(store_options);
  } catch (const std::exception& e) {
    std::cerr << "kolorun: cannot serve the rendezvous on " << store_options.bind_address << ": "
              << e.what() << std::endl;
    return 1;
  }
  sigset_t signals = kolorun_signals();
  int signal_fd = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) {
    std::cerr << "kolorun: signalfd: " << std::strerror(errno) << std::endl;
    return 1;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  setup.job.store_addr = !remote                       ? "127.0.0.1"
                         : !options.store_addr.empty() ? options.store_addr
                                                       : reachable_address(hostname, remote_hosts);
  setup.job.store_port = server->port();
  setup.job.job_id = make_job_id();
  setup.job.backend = options.backend;
  setup.job.timeout_seconds = options.timeout_seconds;
  setup.job.local_cores = usable_cores();
  setup.job.secret = secret;
  setup.job.extra = {
      {"KOLO_ELASTIC", "1"},
      {"KOLO_ELASTIC_TIMEOUT_SECONDS", format_seconds(options.elastic_timeout_seconds + 60.0)}};
  setup.signal_fd = signal_fd;
  setup.eviction_timeout_seconds = options.timeout_seconds.value_or(
      Config::load(process_env()).get_double("KOLO_TIMEOUT_SECONDS"));
  setup.parent_environ = current_environ();
  setup.working_dir = working_directory();
  if (options.verbose) {
    std::cerr << "kolorun: elastic: rendezvous on " << store_options.bind_address << ":"
              << server->port() << " (authenticated with a per-job secret)" << std::endl;
  }
  Outcome outcome;
  {
    auto store = connect_tcp_store("127.0.0.1", server->port(), std::chrono::seconds(10), secret);
    ElasticDriver driver(setup, *output, store);
    outcome = driver.run();
  }
  close(signal_fd);
  return report(outcome, *output);
}

int launch(const LaunchOptions& options) {
  if (options.elastic()) return launch_elastic(options);
  if (std::getenv("KOLO_JOB_SECRET") != nullptr) {
    // kolorun makes the secret of its store itself when the store needs one
    // (other hosts take part). A worker holding a stray one waits for a
    // handshake that an unauthenticated store never sends: every rank would
    // hang for --timeout.
    std::cerr << "kolorun: KOLO_JOB_SECRET is set, but kolorun makes its store's secret itself "
                 "(elastic mode, or other hosts); the workers do not get this one"
              << std::endl;
    unsetenv("KOLO_JOB_SECRET");
  }
  PlanContext context;
  context.hostname = this_hostname();
  context.path = process_parent_env()("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  context.compiled = compiled_backends();
  context.reachable_address = [&](const std::vector<std::string>& remote_hosts) {
    return reachable_address(context.hostname, remote_hosts);
  };
  context.process_limit = host_process_limit();
  JobPlan plan = plan_job(options, context);  // UsageError: nothing spawned yet
  if (options.backend == "mpi") return exec_mpirun(options, plan);

  const int world_size = static_cast<int>(plan.placements.size());
  OutputRouter::Options output_options;
  output_options.mode = options.output;
  output_options.output_dir = options.output_dir;
  std::unique_ptr<OutputRouter> output;
  try {
    output = std::make_unique<OutputRouter>(output_options, world_size);
  } catch (const std::system_error& e) {
    throw UsageError("--output-dir " + options.output_dir + ": " + e.what());
  }

  // A store that other hosts can reach is authenticated with a per-job
  // secret (remote workers read it from ssh's stdin, never a command line).
  const std::string secret = plan.any_remote ? make_secret() : "";
  std::unique_ptr<TcpStoreServer> store;
  try {
    TcpStoreServer::Options store_options;
    store_options.bind_address = plan.store_bind;
    store_options.secret = secret;
    store_options.on_reject = store_reporter("kolorun: rendezvous: ");
    store_limits_from(Config::load(process_env()), store_options);
    store = std::make_unique<TcpStoreServer>(store_options);
  } catch (const std::exception& e) {
    std::cerr << "kolorun: cannot serve the rendezvous store on " << plan.store_bind << ": "
              << e.what() << std::endl;
    return 1;
  }

  sigset_t signals = kolorun_signals();
  int signal_fd = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) {
    std::cerr << "kolorun: signalfd: " << std::strerror(errno) << std::endl;
    return 1;
  }
  // Descendants orphaned by a worker come back to kolorun, which kills them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  JobInfo job;
  job.size = world_size;
  job.store_addr = plan.store_addr;
  job.store_port = store->port();
  job.job_id = make_job_id();
  job.backend = options.backend;
  job.timeout_seconds = options.timeout_seconds;
  job.local_cores = usable_cores();
  job.secret = secret;

  SupervisorOptions supervisor_options;
  supervisor_options.grace_seconds = options.grace_seconds;
  supervisor_options.job_timeout_seconds = options.job_timeout_seconds;
  supervisor_options.signal_fd = signal_fd;
  // kolorun's own client of its store, made at its first use (an early
  // exit to announce, an eviction poll).
  std::shared_ptr<Store> own_store;
  auto own_client = [&]() -> Store& {
    if (!own_store) {
      own_store = connect_tcp_store("127.0.0.1", store->port(), std::chrono::seconds(10), secret);
    }
    return *own_store;
  };
  supervisor_options.on_clean_exit = [&](int rank) {
    if (world_size < 2) return;
    try {
      detail::announce_clean_exit(own_client(), rank);
    } catch (const std::exception& e) {
      std::cerr << "kolorun: cannot tell the other ranks through the store that rank " << rank
                << " exited: " << e.what() << std::endl;
    }
  };
  const std::vector<std::string> parent_environ = current_environ();
  const ParentEnv parent = process_parent_env();
  const std::string cwd = working_directory();
  if (options.servers > 0) {
    supervisor_options.ps_workers = world_size - options.servers;
    supervisor_options.restart_workers = options.restart_workers;
    // A restarted worker: the same placement and variables, plus its
    // generation, which makes it rejoin instead of forming the world.
    supervisor_options.restart = [&](int rank, int generation) {
      JobInfo rejoin = job;
      rejoin.extra.push_back({"KOLO_PS_REJOIN", std::to_string(generation)});
      const Placement& placement = plan.placements[rank];
      SpawnRequest request =
          worker_request(plan, options, placement, rejoin, parent_environ, parent, cwd);
      if (options.verbose)
        std::cerr << describe_request(placement, request, parent_environ) << "\n";
      return WorkerProcess{placement.rank, placement.host, !placement.local,
                           spawn_process(request)};
    };
    // A worker that a server finds frozen is killed (and restarted as above).
    supervisor_options.evictions = [&, seen = int64_t{0}]() mutable {
      return detail::new_evictions(own_client(), &seen);
    };
  }
  Outcome outcome;
  {
    Supervisor supervisor(supervisor_options, *output);
    for (const auto& placement : plan.placements) {
      if (supervisor.stopping()) break;
      SpawnRequest request =
          worker_request(plan, options, placement, job, parent_environ, parent, cwd);
      if (options.verbose)
        std::cerr << describe_request(placement, request, parent_environ) << "\n";
      try {
        SpawnedProcess process = spawn_process(request);
        supervisor.add({placement.rank, placement.host, !placement.local, process});
      } catch (const std::system_error& e) {
        supervisor.start_failed(placement.rank, e.what());
        break;
      }
      supervisor.poll_once();
    }
    outcome = supervisor.run();
  }
  close(signal_fd);
  return report(outcome, *output);
}

int run(int argc, char** argv) {
  ensure_standard_fds();
  sigset_t signals = kolorun_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed terminal must not kill the launcher
  // A file-size limit makes writes to --output-dir logs fail with EFBIG,
  // which kolorun reports, instead of killing it (spawn.cc resets both).
  signal(SIGXFSZ, SIG_IGN);

  CommandLine command;
  try {
    command = parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    switch (command.action) {
      case Action::kHelp:
        std::cout << command.help_text;
        return 0;
      case Action::kVersion:
        std::cout << version_text() << "\n";
        return 0;
      case Action::kCheckBuild: {
        if (command.options.hosts.empty()) {
          std::cout << check_build_text();
          return 0;
        }
        RemoteCheckOptions check;
        check.kolorun_path = self_path();
        check.local_report = check_build_text();
        return check_build_on_hosts(command.options, check, std::cout);
      }
      case Action::kPrintEnvDocs:
        std::cout << Config::markdown();
        return 0;
      case Action::kLaunch:
        return launch(command.options);
    }
  } catch (const UsageError& e) {
    std::cerr << "kolorun: " << e.what() << std::endl;
    return kUsageExitCode;
  } catch (const std::exception& e) {
    std::cerr << "kolorun: " << e.what() << std::endl;
    return 1;
  }
  return 1;
}

}  // namespace
}  // namespace kolo::launcher

int main(int argc, char** argv) { return kolo::launcher::run(argc, argv); }
