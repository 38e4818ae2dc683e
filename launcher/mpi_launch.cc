// mpirun command construction for --backend mpi (mpi_launch.h).
#include "mpi_launch.h"

#include <algorithm>
#include <cmath>

#include "usage_error.h"

namespace kolo::launcher {

std::string default_mpirun() {
#ifdef KOLORUN_MPIEXEC
  std::string configured = KOLORUN_MPIEXEC;
  if (!configured.empty()) return configured;
#endif
  return "mpirun";
}

std::vector<std::string> mpirun_command(const LaunchOptions& options,
                                        const std::vector<HostSlots>& hosts,
                                        const std::string& mpirun, int local_cores,
                                        const std::vector<std::string>& parent_environ,
                                        const ParentEnv& parent) {
  if (options.output == OutputMode::kRank0Only) {
    throw UsageError(
        "--rank0-only does not work with --backend mpi (mpirun prints every rank): leave it out, "
        "or use --tag-output or --output-dir DIR");
  }
  std::vector<std::string> argv = {mpirun};
  if (options.np) argv.insert(argv.end(), {"-np", std::to_string(*options.np)});
  if (hosts.empty()) {
    argv.push_back("--oversubscribe");  // kolorun runs -np N locally whatever the core count
  } else {
    std::string list;
    for (const auto& host : hosts) {
      list += (list.empty() ? "" : ",") + host.name + ":" + std::to_string(host.slots);
    }
    argv.insert(argv.end(), {"--host", list});
  }
  // kolorun does not pin its workers; neither should mpirun (it binds to cores
  // by default for small jobs, which fights the thread variables below).
  argv.insert(argv.end(), {"--bind-to", "none"});
  if (options.output == OutputMode::kTag) argv.push_back("--tag-output");
  if (!options.output_dir.empty())
    argv.insert(argv.end(), {"--output-filename", options.output_dir});
  if (options.job_timeout_seconds) {
    long seconds = std::lround(std::ceil(*options.job_timeout_seconds));
    argv.insert(argv.end(), {"--timeout", std::to_string(std::max(1L, seconds))});
  }
  if (options.ssh_command != "ssh") {
    argv.insert(argv.end(), {"--mca", "plm_rsh_agent", options.ssh_command});
  }

  std::vector<std::string> exported = {"KOLO_BACKEND=mpi"};
  if (options.timeout_seconds) {
    exported.push_back("KOLO_TIMEOUT_SECONDS=" + format_seconds(*options.timeout_seconds));
  }
  bool all_local = true;
  for (const auto& host : hosts) all_local = all_local && is_local_host(host.name, this_hostname());
  if (all_local) {
    int np = options.np.value_or(0);
    if (np == 0) {
      for (const auto& host : hosts) np += host.slots;
    }
    const std::string threads = chosen_thread_count(parent).value_or(
        std::to_string(std::max(1, local_cores / std::max(1, np))));
    for (const auto& name : thread_variables()) {
      if (!parent(name)) exported.push_back(name + "=" + threads);
    }
  }
  // mpirun copies its whole environment to local ranks but only -x names to
  // remote ones: name the user's other KOLO_* settings and the -x entries.
  for (const auto& entry : parent_environ) {
    std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("KOLO_", 0) == 0 && name != "KOLO_BACKEND" &&
        !(options.timeout_seconds && name == "KOLO_TIMEOUT_SECONDS")) {
      exported.push_back(name);
    }
  }
  // The allocator settings: the user's (-x, or kolorun's environment, which
  // mpirun passes on by name) or kolorun's default.
  for (const EnvVar& var : allocator_variables()) {
    const std::string& name = var.first;
    const bool forwarded = std::any_of(
        options.forward_env.begin(), options.forward_env.end(),
        [&](const std::string& entry) { return entry.substr(0, entry.find('=')) == name; });
    if (forwarded) continue;
    exported.push_back(parent(name) ? name : name + "=" + var.second);
  }
  for (const auto& entry : options.forward_env) exported.push_back(entry);
  for (const auto& entry : exported) argv.insert(argv.end(), {"-x", entry});

  argv.push_back(options.program);
  argv.insert(argv.end(), options.program_args.begin(), options.program_args.end());
  return argv;
}

}  // namespace kolo::launcher
