// kolorun's command line: what to launch and how.
//
//   kolorun -np N [-H host1:slots,host2:slots] [--backend shm|gloo|mpi]
//           [--timeout SECONDS] [--tag-output|--rank0-only] program args...
//
// Everything from the program on is passed to it untouched (the first token that
// is neither an option nor an option's value starts the program; `--` forces it).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kolo::launcher {

// How the workers' stdout/stderr reach kolorun's stdout/stderr. Lines are never
// interleaved mid-line in any mode.
enum class OutputMode {
  kPlain,      // lines as the workers wrote them (default, like mpirun)
  kTag,        // "[1,<rank>]<stdout>:line" (mpirun --tag-output)
  kRank0Only,  // only rank 0's lines; the others' are discarded (kept in --output-dir)
};

struct LaunchOptions {
  // Number of workers; nullopt = every slot of -H (required without -H).
  std::optional<int> np;
  // --servers S: parameter servers started after the np workers given; once
  // parsed, np counts them too and forward_env carries KOLO_PS_SERVERS=S.
  int servers = 0;
  // --restart-workers N (with --servers): a failed worker is restarted, at
  // most N times in all, with KOLO_PS_REJOIN=g (its g-th restart), and
  // rejoins the running servers (kolo/core/parameter_server.h).
  int restart_workers = 0;
  std::string hosts;  // -H as given; empty = every worker on this host
  // "shm", "gloo", "mpi" or empty (automatic, KOLO_BACKEND not set).
  std::string backend;
  // Collective and rendezvous timeout of the workers (KOLO_TIMEOUT_SECONDS).
  std::optional<double> timeout_seconds;
  // Wall-clock limit of the whole job; the workers are stopped when it passes.
  std::optional<double> job_timeout_seconds;
  // Seconds between SIGTERM and SIGKILL when workers are stopped.
  double grace_seconds = 5.0;
  OutputMode output = OutputMode::kPlain;
  // When set, each rank's full output also goes to <dir>/rank.<r>.log.
  std::string output_dir;
  // Extra environment variables to forward to remote workers (-x NAME[=VALUE]).
  std::vector<std::string> forward_env;
  // How remote hosts are reached; split on spaces ("ssh -p 2222" works).
  std::string ssh_command = "ssh";
  // Address remote workers use to reach the store; default: this host's name.
  std::string store_addr;
  bool verbose = false;  // print the spawn plan to stderr

  // Elastic mode (docs/elastic.md): on when --min-np, --max-np or
  // --host-discovery-script is given. The world is re-formed when a worker
  // fails or new slots appear, between min_np and max_np workers.
  std::optional<int> min_np;  // default: -np (or 1 with discovery)
  std::optional<int> max_np;  // default: -np (or every discovered slot)
  // Re-formations after a failed member before the job fails (torchrun's
  // --max-restarts); failed starts of new workers do not count.
  int max_restarts = 3;
  // Executable printing "host:slots" lines; run every discovery_interval.
  std::string host_discovery_script;
  double discovery_interval_seconds = 1.0;
  // How long kolorun waits for enough workers (at the start, and when fewer
  // than min_np remain) before it stops the job.
  double elastic_timeout_seconds = 60.0;
  // A host whose worker failed is set aside for cooldown * 2^(failures-1)
  // seconds (at most kMaxCooldownSeconds in elastic_driver.h).
  double cooldown_seconds = 10.0;
  bool elastic() const { return min_np || max_np || !host_discovery_script.empty(); }

  std::string program;
  std::vector<std::string> program_args;
};

enum class Action { kLaunch, kHelp, kVersion, kCheckBuild, kPrintEnvDocs };

struct CommandLine {
  Action action = Action::kLaunch;
  LaunchOptions options;
  std::string help_text;  // filled for kHelp
};

// Parses argv without argv[0]. Throws UsageError (one line) on a bad argument.
// Checks the form of each value (numbers, backend names); checks that need the
// host list or the file system happen when the job is planned.
CommandLine parse_command_line(const std::vector<std::string>& args);

// Backends kolorun accepts for --backend (whether compiled in is checked later).
const std::vector<std::string>& known_backends();

}  // namespace kolo::launcher
