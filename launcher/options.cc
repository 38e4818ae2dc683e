// Command-line parsing with CLI11. kolorun's own options come first; the first
// token that is neither an option nor an option's value is the program, and it
// and everything after it belong to the program (CLI11 never sees them, so a
// program flag such as `--np` or `-H` cannot be mistaken for kolorun's).
#include "options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "usage_error.h"
#include "worker_env.h"

namespace kolo::launcher {
namespace {

// Most workers, restarts... a flag may ask for (also keeps int arithmetic safe).
constexpr long kMaxCount = 1000000;
// Longest time a flag may give, in seconds: beyond it, durations in
// nanoseconds or milliseconds would overflow (about 31 years).
constexpr double kMaxSeconds = 1e9;

// A whole number in [min_value, kMaxCount]; `what` says what it counts.
int parse_whole(const std::string& flag, const std::string& text, long min_value,
                const std::string& what, const std::string& example) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || (errno != 0 && errno != ERANGE)) {
    throw UsageError(flag + " '" + text + "': expected a whole number of " + what + " (e.g. " +
                     example + ")");
  }
  if (errno == ERANGE || value > kMaxCount) {
    throw UsageError(flag + " " + text + ": too large; at most " + std::to_string(kMaxCount) +
                     " (e.g. " + example + ")");
  }
  if (value < min_value) {
    throw UsageError(flag + " " + text + ": the number of " + what + " must be at least " +
                     std::to_string(min_value) + " (e.g. " + example + ")");
  }
  return static_cast<int>(value);
}

// A count of processes >= 1: `what` names them in the error ("workers",
// "parameter servers").
int parse_count(const std::string& flag, const std::string& text, const std::string& example,
                const std::string& what = "workers") {
  return parse_whole(flag, text, 1, what, example);
}

// Seconds in [min_seconds, kMaxSeconds] (0 allowed when allow_zero).
double parse_seconds(const std::string& flag, const std::string& text, bool allow_zero,
                     double min_seconds = 0) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool bad = text.empty() || *end != '\0' || errno != 0 || !std::isfinite(value) ||
                   value < 0 || (!allow_zero && value == 0);
  if (bad) {
    throw UsageError(flag + " '" + text + "': expected a number of seconds " +
                     (allow_zero ? ">= 0" : "> 0") + " (e.g. " + flag + " 60)");
  }
  if (value > kMaxSeconds) {
    throw UsageError(flag + " " + text + ": too large; at most " +
                     std::to_string(long(kMaxSeconds)) + " seconds");
  }
  if (value < min_seconds && !(allow_zero && value == 0)) {
    char least[32];
    std::snprintf(least, sizeof(least), "%g", min_seconds);
    throw UsageError(flag + " " + text +
                     ": too small; kolo's timeouts count whole milliseconds, give at least " +
                     least + " (e.g. " + flag + " 60)");
  }
  return value;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

// Splits args into kolorun's part and the program's part, using the option
// table of `app` to know which options consume the next token. "-np" (the
// mpirun spelling, which CLI11 cannot declare) is rewritten to "--np".
std::pair<std::vector<std::string>, std::vector<std::string>> split_program(
    const CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> own;
  size_t i = 0;
  while (i < args.size()) {
    std::string token = args[i];
    if (token == "--") {
      ++i;
      break;
    }
    if (token.size() < 2 || token[0] != '-') break;  // the program
    if (token == "-np") token = "--np";
    own.push_back(token);
    ++i;
    std::string name;
    bool attached = false;
    if (token.rfind("--", 0) == 0) {
      size_t eq = token.find('=');
      name = token.substr(0, eq);
      attached = eq != std::string::npos;
    } else {
      name = token.substr(0, 2);
      attached = token.size() > 2;
    }
    const CLI::Option* option = app.get_option_no_throw(name);
    if (option != nullptr && option->get_items_expected_min() > 0 && !attached && i < args.size()) {
      own.push_back(args[i]);
      ++i;
    }
  }
  return {own, std::vector<std::string>(args.begin() + static_cast<long>(i), args.end())};
}

// Prints kolorun's synopsis instead of CLI11's generic "Usage: kolorun [OPTIONS]".
class SynopsisFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "\nUsage: kolorun -np N [-H host1:slots,host2:slots] [--backend shm|gloo|mpi]\n"
           "               [--timeout SECONDS] [--tag-output|--rank0-only] program args...\n";
  }
};

}  // namespace

const std::vector<std::string>& known_backends() {
  static const std::vector<std::string> names = {"shm", "gloo", "mpi"};
  return names;
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine result;
  LaunchOptions& o = result.options;

  CLI::App app{
      "kolorun: starts the workers of a kolo job, serves their rendezvous store, tags or\n"
      "filters their output, and stops them all when one fails.",
      "kolorun"};
  app.formatter(std::make_shared<SynopsisFormatter>());
  app.footer(
      "The program and everything after it are passed to the workers untouched.\n"
      "Each worker gets KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
      "KOLO_CROSS_RANK, KOLO_CROSS_SIZE, KOLO_STORE_ADDR, KOLO_STORE_PORT, KOLO_JOB_ID\n"
      "(and the first six under Horovod's names, HOROVOD_RANK ...), and\n"
      "OMP/OPENBLAS/MKL_NUM_THREADS = cores / local workers (unless already set).\n"
      "See docs/kolorun.md.");

  std::string np_text, timeout_text, job_timeout_text, grace_text;
  bool tag = false, rank0_only = false, check_build = false, env_docs = false, version = false;
  app.add_option("-n,--np", np_text,
                 "Number of workers (also -np). Default with -H: every slot of the host list")
      ->type_name("N");
  std::string servers_text;
  app.add_option("--servers", servers_text,
                 "Parameter servers: start S ranks after the -np workers, which serve "
                 "(KOLO_PS_SERVERS=S; kolo/torch/parameter_server.h)")
      ->type_name("S");
  std::string restart_workers_text;
  app.add_option("--restart-workers", restart_workers_text,
                 "With --servers: restart a worker that fails, at most N times in all; it "
                 "rejoins the running servers (modes async and ssp; KOLO_PS_REJOIN)")
      ->type_name("N");
  app.add_option("-H,--hosts", o.hosts,
                 "Hosts and their slots, in rank order: host1:slots,host2:slots "
                 "(localhost, 127.0.0.1 and this host's name run locally; others over ssh)")
      ->type_name("HOSTS");
  app.add_option("--backend", o.backend,
                 "Communicator backend of the workers (KOLO_BACKEND): shm, gloo or mpi "
                 "(mpi runs the job through mpirun). Default: automatic")
      ->type_name("NAME");
  app.add_option("--timeout", timeout_text,
                 "Timeout of each collective and of the rendezvous, in seconds "
                 "(KOLO_TIMEOUT_SECONDS)")
      ->type_name("SECONDS");
  app.add_option("--job-timeout", job_timeout_text,
                 "Stop the whole job after this many seconds (exit code 124)")
      ->type_name("SECONDS");
  app.add_option("--grace", grace_text,
                 "Seconds between SIGTERM and SIGKILL when workers are stopped (default 5)")
      ->type_name("SECONDS");
  auto* tag_flag = app.add_flag("--tag-output", tag,
                                "Prefix each output line with [1,<rank>]<stdout>: or <stderr>:");
  auto* rank0_flag = app.add_flag("--rank0-only", rank0_only,
                                  "Print only rank 0's output (use --output-dir to keep the "
                                  "others')");
  tag_flag->excludes(rank0_flag);
  app.add_option("--output-dir", o.output_dir,
                 "Also write each rank's full output to DIR/rank.<rank>.log")
      ->type_name("DIR");
  app.add_option("-x", o.forward_env,
                 "-x NAME=VALUE sets a variable for every worker; -x NAME forwards this one to "
                 "remote workers (repeatable; KOLO_* and thread variables always go)")
      ->type_name("NAME[=VALUE]");
  app.add_option("--ssh-command", o.ssh_command,
                 "Command that reaches a remote host (default: ssh); options may follow, "
                 "e.g. \"ssh -p 2222\"")
      ->type_name("CMD");
  app.add_option("--store-addr", o.store_addr,
                 "Address remote workers use to reach this host's store (default: host name)")
      ->type_name("ADDR");
  std::string min_np_text, max_np_text, max_restarts_text, discovery_interval_text,
      elastic_timeout_text, cooldown_text;
  app.add_option("--min-np", min_np_text,
                 "Elastic mode: fewest workers to train with; fewer for --elastic-timeout "
                 "stops the job")
      ->type_name("N");
  app.add_option("--max-np", max_np_text, "Elastic mode: most workers to train with")
      ->type_name("N");
  app.add_option("--max-restarts", max_restarts_text,
                 "Elastic mode: times the world is re-formed after a failed worker before the "
                 "job fails (default 3)")
      ->type_name("N");
  app.add_option("--host-discovery-script", o.host_discovery_script,
                 "Elastic mode: executable printing the available hosts as host:slots lines, "
                 "run every --discovery-interval")
      ->type_name("PATH");
  app.add_option("--discovery-interval", discovery_interval_text,
                 "Elastic mode: seconds between runs of the discovery script (default 1)")
      ->type_name("SECONDS");
  app.add_option("--elastic-timeout", elastic_timeout_text,
                 "Elastic mode: seconds to wait for --min-np workers before stopping the job "
                 "(default 60)")
      ->type_name("SECONDS");
  app.add_option("--cooldown", cooldown_text,
                 "Elastic mode: seconds a host is set aside after its worker failed, doubled "
                 "on each further failure (default 10)")
      ->type_name("SECONDS");
  app.add_flag("-v,--verbose", o.verbose, "Print each worker's command and variables to stderr");
  app.add_flag("--check-build", check_build, "List the backends and frameworks compiled in");
  app.add_flag("--print-env-docs", env_docs,
               "Print the KOLO_* variables as Markdown (docs/env_vars.md)");
  app.add_flag("--version", version, "Print kolo's version");

  auto [own, program] = split_program(app, args);
  std::vector<std::string> reversed(own.rbegin(), own.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.action = Action::kHelp;
    result.help_text = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    if (message.find('\n') != std::string::npos) message = message.substr(0, message.find('\n'));
    throw UsageError(message + " (see kolorun --help)");
  }

  if (check_build) {
    result.action = Action::kCheckBuild;
    return result;
  }
  if (env_docs) {
    result.action = Action::kPrintEnvDocs;
    return result;
  }
  if (version) {
    result.action = Action::kVersion;
    return result;
  }

  if (!np_text.empty()) o.np = parse_count("-np", np_text, "-np 2");
  if (!servers_text.empty()) {
    o.servers = parse_count("--servers", servers_text, "--servers 1", "parameter servers");
    if (!o.np) {
      throw UsageError("--servers " + servers_text +
                       " needs -np: say how many workers to start besides the servers, e.g. "
                       "kolorun -np 2 --servers 1 ./train");
    }
  }
  if (!restart_workers_text.empty()) {
    o.restart_workers = parse_whole("--restart-workers", restart_workers_text, 0, "restarts",
                                    "--restart-workers 3");
    if (o.servers == 0) {
      throw UsageError("--restart-workers " + restart_workers_text +
                       " restarts parameter-server workers, which rejoin the running servers: "
                       "add --servers S (an allreduce job re-forms instead: --min-np/--max-np)");
    }
    if (o.backend == "mpi") {
      throw UsageError(
          "--restart-workers cannot run with --backend mpi: an MPI world cannot "
          "take a new process; use shm or gloo (or leave --backend out)");
    }
  }
  if (!min_np_text.empty()) o.min_np = parse_count("--min-np", min_np_text, "--min-np 2");
  if (!max_np_text.empty()) o.max_np = parse_count("--max-np", max_np_text, "--max-np 4");
  if (!max_restarts_text.empty()) {
    o.max_restarts =
        parse_whole("--max-restarts", max_restarts_text, 0, "restarts", "--max-restarts 3");
  }
  if (!discovery_interval_text.empty()) {
    o.discovery_interval_seconds =
        parse_seconds("--discovery-interval", discovery_interval_text, false);
  }
  if (!elastic_timeout_text.empty()) {
    o.elastic_timeout_seconds = parse_seconds("--elastic-timeout", elastic_timeout_text, false);
  }
  if (!cooldown_text.empty()) o.cooldown_seconds = parse_seconds("--cooldown", cooldown_text, true);
  if (o.min_np && o.max_np && *o.min_np > *o.max_np) {
    throw UsageError("--min-np " + std::to_string(*o.min_np) + " is more than --max-np " +
                     std::to_string(*o.max_np) + ": the fewest workers cannot exceed the most");
  }
  if (o.elastic() && o.backend == "mpi") {
    throw UsageError(
        "--backend mpi cannot be elastic: an MPI world cannot change its members; use shm or "
        "gloo (or leave --backend out) with --min-np/--max-np/--host-discovery-script");
  }
  if (!o.elastic() && (!max_restarts_text.empty() || !discovery_interval_text.empty() ||
                       !elastic_timeout_text.empty() || !cooldown_text.empty())) {
    throw UsageError(
        "--max-restarts, --discovery-interval, --elastic-timeout and --cooldown belong to "
        "elastic mode: add --min-np N (and --max-np M) or --host-discovery-script");
  }
  if (!o.np && o.hosts.empty() && o.host_discovery_script.empty()) {
    throw UsageError(
        "-np is missing: say how many workers to start, e.g. kolorun -np 2 ./train (or give "
        "-H host:slots to use every slot)");
  }
  if (!o.backend.empty() && o.backend != "auto") {
    const auto& names = known_backends();
    if (std::find(names.begin(), names.end(), o.backend) == names.end()) {
      throw UsageError("--backend '" + o.backend + "' is not a backend: use one of " +
                       join(names, ", ") + " (or leave --backend out for automatic choice)");
    }
  }
  if (o.backend == "auto") o.backend.clear();
  if (o.servers > 0 && o.elastic()) {
    throw UsageError(
        "--servers cannot be elastic: parameter servers hold the model and must stay; leave out "
        "--min-np/--max-np/--host-discovery-script");
  }
  if (!timeout_text.empty()) {
    o.timeout_seconds = parse_seconds("--timeout", timeout_text, false, 0.001);
  }
  if (!job_timeout_text.empty()) {
    o.job_timeout_seconds = parse_seconds("--job-timeout", job_timeout_text, false);
  }
  if (!grace_text.empty()) o.grace_seconds = parse_seconds("--grace", grace_text, true);
  if (tag) o.output = OutputMode::kTag;
  if (rank0_only) o.output = OutputMode::kRank0Only;
  for (const auto& entry : o.forward_env) {
    if (entry.empty() || entry[0] == '=') {
      throw UsageError("-x '" + entry + "': expected NAME or NAME=VALUE (e.g. -x LD_LIBRARY_PATH)");
    }
    // kolorun's own variables would reach a worker twice (C++ getenv sees one
    // value, Python and sh another) or contradict its placement.
    const std::string name = entry.substr(0, entry.find('='));
    for (const auto& [own, meaning] : launcher_variables()) {
      if (name == own) {
        throw UsageError("-x " + entry + ": kolorun sets " + name + " itself (" + meaning +
                         "); leave it out");
      }
    }
    if (name == "KOLO_PS_SERVERS" && o.servers > 0) {
      throw UsageError("-x " + entry + " contradicts --servers " + servers_text + ": give one");
    }
    if (name == "KOLO_BACKEND" && !o.backend.empty()) {
      throw UsageError("-x " + entry + " contradicts --backend " + o.backend + ": give one");
    }
    if (name == "KOLO_TIMEOUT_SECONDS" && !timeout_text.empty()) {
      throw UsageError("-x " + entry + " contradicts --timeout " + timeout_text + ": give one");
    }
  }
  if (o.servers > 0) {
    // The servers are the last ranks of one larger job; every launch path
    // (local, ssh, mpirun) forwards the variable that tells ranks their role.
    *o.np += o.servers;
    o.forward_env.push_back("KOLO_PS_SERVERS=" + std::to_string(o.servers));
  }
  if (o.ssh_command.find_first_not_of(' ') == std::string::npos) {
    throw UsageError("--ssh-command is empty: give the program that reaches a host, e.g. ssh");
  }

  if (program.empty()) {
    throw UsageError(
        "no program given: write it after kolorun's options, e.g. kolorun -np 2 ./train "
        "--epochs 3");
  }
  o.program = program.front();
  o.program_args.assign(program.begin() + 1, program.end());
  return result;
}

}  // namespace kolo::launcher
